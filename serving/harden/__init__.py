"""Hardening harness of the proxy: everything ``make harden`` runs, each part bounded in time and
loopback-only, as library functions with thin callers (``examples/hardening_report.py``, the tests).

* :mod:`~serving.harden.stub`: a scriptable OpenAI-compatible upstream on 127.0.0.1 that can be down,
  slow, failing, malformed or cut off mid-stream.
* :mod:`~serving.harden.faults`: the fault matrix: the proxy in front of the stub, one scenario per fault,
  each checked for the right OpenAI-shaped error, no hang, and recovery once the upstream is healthy.
* :mod:`~serving.harden.load`: a fixed number of requests from concurrent clients against the proxy in a
  child process (fake decoder, stub upstream or the real in-process decoder): requests/s, latency
  percentiles, errors, RSS before and after.
* :mod:`~serving.harden.fuzz`: schemathesis cases from the proxy's OpenAPI document, sent in-process:
  no 5xx, every error OpenAI-shaped (needs the ``dev`` extra).
"""

__all__: list[str] = []
