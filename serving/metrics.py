"""Counters behind ``GET /metrics`` (Prometheus text format): requests by endpoint and status, latency
(count, sum and p50/p95 over the last 1,000 requests per endpoint) and tokens saved by compression."""

from __future__ import annotations

import threading
from collections import defaultdict, deque
from typing import Any

from .protocol import CompressionInfo

__all__ = ["Metrics"]

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else 0.0


class Metrics:
    """Thread-safe in-memory counters; one instance per app."""

    def __init__(self, window: int = 1000) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = defaultdict(int)
        self.latency_sum: dict[str, float] = defaultdict(float)
        self.latency_count: dict[str, int] = defaultdict(int)
        self.recent: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=window))
        self.compressed = 0
        self.tokens_before = 0
        self.tokens_after = 0
        self.compression_s = 0.0
        self.batcher: Any = None  # the handler's CompressionBatcher: batches made and requests they carried
        self.decode_batcher: Any = None  # the embedded decoder's DecodeBatcher, the same counts for decoding
        self.caches: Any = None  # the handler's cache_counts: per method, (hits, misses) of its per-passage cache

    def record_request(self, path: str, status: int, seconds: float) -> None:
        endpoint = path if path in ENDPOINTS else "other"
        with self._lock:
            self.requests[(endpoint, status)] += 1
            self.latency_sum[endpoint] += seconds
            self.latency_count[endpoint] += 1
            self.recent[endpoint].append(seconds)

    def record_compression(self, info: CompressionInfo) -> None:
        if not info.documents:
            return
        with self._lock:
            self.compressed += 1
            self.tokens_before += info.tokens_before
            self.tokens_after += info.tokens_after
            self.compression_s += info.compression_ms / 1000

    def render(self) -> str:
        with self._lock:
            lines = ["# HELP ragpress_requests_total HTTP requests by endpoint and status.",
                     "# TYPE ragpress_requests_total counter"]
            for (ep, status), n in sorted(self.requests.items()):
                lines.append(f'ragpress_requests_total{{endpoint="{ep}",status="{status}"}} {n}')
            lines += ["# HELP ragpress_request_seconds Request latency, to the last byte sent.",
                      "# TYPE ragpress_request_seconds summary"]
            for ep in sorted(self.latency_count):
                recent = list(self.recent[ep])
                for q in (0.5, 0.95):
                    lines.append(f'ragpress_request_seconds{{endpoint="{ep}",quantile="{q}"}} {_quantile(recent, q):.6f}')
                lines.append(f'ragpress_request_seconds_sum{{endpoint="{ep}"}} {self.latency_sum[ep]:.6f}')
                lines.append(f'ragpress_request_seconds_count{{endpoint="{ep}"}} {self.latency_count[ep]}')
            lines += [
                "# HELP ragpress_compressed_requests_total Requests that carried documents.",
                "# TYPE ragpress_compressed_requests_total counter",
                f"ragpress_compressed_requests_total {self.compressed}",
                "# HELP ragpress_document_tokens_before_total Document tokens before compression.",
                "# TYPE ragpress_document_tokens_before_total counter",
                f"ragpress_document_tokens_before_total {self.tokens_before}",
                "# HELP ragpress_document_tokens_after_total Document tokens after compression.",
                "# TYPE ragpress_document_tokens_after_total counter",
                f"ragpress_document_tokens_after_total {self.tokens_after}",
                "# HELP ragpress_tokens_saved_total Document tokens removed by compression.",
                "# TYPE ragpress_tokens_saved_total counter",
                f"ragpress_tokens_saved_total {self.tokens_before - self.tokens_after}",
                "# HELP ragpress_compression_seconds_total Time spent compressing.",
                "# TYPE ragpress_compression_seconds_total counter",
                f"ragpress_compression_seconds_total {self.compression_s:.6f}",
            ]
            for what, b in (("compress", self.batcher), ("decode", self.decode_batcher)):
                if b is not None:
                    lines += [
                        f"# HELP ragpress_{what}_batches_total {what.capitalize()} calls (each one batch of requests).",
                        f"# TYPE ragpress_{what}_batches_total counter",
                        f"ragpress_{what}_batches_total {b.batches}",
                        f"# HELP ragpress_{what}_batched_requests_total Requests (generations) those calls carried.",
                        f"# TYPE ragpress_{what}_batched_requests_total counter",
                        f"ragpress_{what}_batched_requests_total {b.batched}",
                    ]
            if self.caches is not None:
                counts = self.caches()
                for what, at in (("hits", 0), ("misses", 1)):
                    lines += [f"# HELP ragpress_cache_{what}_total Per-passage cache reads that found the value"
                              f"{'' if at == 0 else ' missing (computed and stored)'}, by method.",
                              f"# TYPE ragpress_cache_{what}_total counter"]
                    lines += [f'ragpress_cache_{what}_total{{method="{m}"}} {c[at]}' for m, c in sorted(counts.items())]
        return "\n".join(lines) + "\n"
