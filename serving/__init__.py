"""The edge: the ``ragpress`` CLI (and, later, the OpenAI-compatible proxy)."""

__all__: list[str] = []
