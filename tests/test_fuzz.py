"""schemathesis over the proxy's OpenAPI document, in-process on a fake decoder: no 5xx, every error
OpenAI-shaped, every status and body as documented, schema-breaking input refused. Derandomized and small
here (CI); ``make harden`` runs it longer and random."""

from __future__ import annotations

import pytest

pytest.importorskip("schemathesis")

from serving.harden.fuzz import build_fuzz_app, run_fuzz  # noqa: E402


def test_fuzz_finds_nothing(smol_tokenizer):
    report = run_fuzz(build_fuzz_app(smol_tokenizer), max_examples=60, max_seconds=60, derandomize=True)
    assert report.cases >= 150, report  # 5 operations (two with bodies), positive and negative
    assert {200, 400, 404} <= set(report.by_status)  # reached the compressor and the decoder, not just the gate
    assert report.clean, "\n".join(report.examples)


def test_fuzz_reports_a_server_error(smol_tokenizer, monkeypatch):
    """The harness itself: a handler that crashes must show up as 5xx, with the request that did it."""
    from serving import handler

    def boom(self, req):
        raise RuntimeError("boom")

    monkeypatch.setattr(handler.ProxyHandler, "chat", boom)
    report = run_fuzz(build_fuzz_app(smol_tokenizer), max_examples=10, max_seconds=30, derandomize=True)
    assert report.server_errors > 0 and any("/v1/chat/completions" in e for e in report.examples)
