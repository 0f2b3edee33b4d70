"""The bounded load test (serving.harden.load) end to end: a child proxy process, concurrent clients, a
fixed number of requests. Slow (a child process loads the tokenizer): out of CI, run by `make harden`."""

from __future__ import annotations

import pytest

from serving.harden.load import run_load


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fake", "stub"])
def test_bounded_load_serves_every_request(mode):
    r = run_load(mode, requests=60, concurrency=6, max_seconds=60)
    assert r.requests == 60 and r.served == 60 and r.errors == 0, r.first_error
    assert 0 < r.p50_ms <= r.p95_ms <= r.p99_ms and r.rps > 0
    assert r.rss_after_mb < r.rss_before_mb + 50  # no gross leak over 60 requests


def test_unknown_mode_is_refused_before_starting_anything():
    with pytest.raises(ValueError, match="not one of"):
        run_load("nope")
