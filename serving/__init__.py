"""The edge: the ``ragpress`` CLI (:mod:`serving.cli`) and the OpenAI-compatible compression proxy
(:mod:`serving.app`; needs the ``serve`` extra, imported only when used)."""

__all__: list[str] = []
