"""Fuzzing of the proxy's OpenAPI document with schemathesis, in-process (ASGI), on a fake decoder.

Every operation of ``/openapi.json`` gets cases that fit the schema (positive) and cases that break it
(negative); half of the positive chat/completion cases name the served model, so they reach the compressor and the
decoder rather than stopping at a 404. Each response is checked: no 5xx; every error is exactly
``{"error": {"message", "type", "param", "code"}}``; and schemathesis' own checks (status code, content
type and body documented; schema-breaking input rejected). Bounded by ``max_examples`` per operation and
mode, and by ``max_seconds`` overall. Needs the ``dev`` extra (schemathesis, hypothesis).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from compressor.errors import require_extra

__all__ = ["FuzzReport", "build_fuzz_app", "run_fuzz"]

SERVED = "fuzz"
ERROR_KEYS = {"message", "type", "param", "code"}


@dataclass
class FuzzReport:
    cases: int = 0
    server_errors: int = 0  # 5xx answers
    bad_errors: int = 0  # 4xx answers that are not OpenAI-shaped
    check_failures: int = 0  # schemathesis checks (undocumented status, body off-schema, bad input accepted)
    by_status: dict[int, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)  # the first few failures, each with its request
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        return self.server_errors == 0 and self.bad_errors == 0 and self.check_failures == 0

    def _fail(self, what: str, case: Any, detail: str) -> None:
        if len(self.examples) < 8:
            body = json.dumps(case.body, default=str)[:300] if case.body is not None else ""
            self.examples.append(f"{what}: {case.method} {case.path} {body} -> {detail[:400]}")


def build_fuzz_app(tokenizer: Any) -> Any:
    """The proxy with a fake decoder served as ``fuzz`` (no model, no network)."""
    from adapters.decoders import FakeBackend
    from serving.app import ProxySettings, create_app

    return create_app(ProxySettings(served_model_name=SERVED, method="bm25", timeout_s=10),
                      backend=FakeBackend(tokenizer, model_name=SERVED))


def _openai_error(resp: Any) -> bool:
    try:
        body = resp.json()
    except ValueError:
        return False
    err = body.get("error") if isinstance(body, dict) else None
    return (set(body) == {"error"} and isinstance(err, dict) and set(err) == ERROR_KEYS
            and isinstance(err["message"], str) and bool(err["message"]) and isinstance(err["type"], str))


def run_fuzz(app: Any = None, *, tokenizer: Any = None, max_examples: int = 100, max_seconds: float = 60.0,
             derandomize: bool = False, chunk: int = 25) -> FuzzReport:
    """Fuzz ``app`` (default: :func:`build_fuzz_app`); see the module docstring."""
    require_extra("schemathesis", "dev")
    import schemathesis
    from hypothesis import HealthCheck, Phase, Verbosity, given, settings
    from hypothesis import strategies as st
    from hypothesis.errors import Unsatisfiable
    from schemathesis.checks import not_a_server_error
    from schemathesis.core.failures import FailureGroup
    from schemathesis.core.result import Ok
    from schemathesis.python import asgi
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        negative_data_rejection,
        response_schema_conformance,
        status_code_conformance,
    )

    if app is None:
        if tokenizer is None:
            from compressor.models import load_tokenizer

            tokenizer = load_tokenizer("smollm2-135m-instruct")
        app = build_fuzz_app(tokenizer)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    checks = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
              negative_data_rejection]
    report = FuzzReport()
    t0 = time.monotonic()
    deadline = t0 + max_seconds

    with asgi.get_client(app) as client:

        def check(case: Any, named: bool, positive: bool) -> None:
            if time.monotonic() > deadline:
                return
            if named and positive and case.method == "POST" and isinstance(case.body, dict):
                case.body["model"] = SERVED
            try:
                resp = case.call(session=client)
            except Exception as e:  # noqa: BLE001 - the app raised: the client got a 500
                report.cases += 1
                report.server_errors += 1
                report.by_status[500] = report.by_status.get(500, 0) + 1
                report._fail("5xx (app raised)", case, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                return
            report.cases += 1
            report.by_status[resp.status_code] = report.by_status.get(resp.status_code, 0) + 1
            if resp.status_code >= 500:
                report.server_errors += 1
                report._fail("5xx", case, f"{resp.status_code} {resp.text}")
            elif resp.status_code >= 400 and not _openai_error(resp):
                report.bad_errors += 1
                report._fail("error not OpenAI-shaped", case, f"{resp.status_code} {resp.text}")
            try:
                case.validate_response(resp, checks=checks)
            except FailureGroup as e:
                report.check_failures += 1
                meta = getattr(case, "meta", None)  # for a negative case: which part of the schema it breaks
                how = getattr(getattr(getattr(meta, "phase", None), "data", None), "description", None) or ""
                report._fail("schemathesis", case, f"{resp.status_code} {e.exceptions[0].title} {how}: {resp.text}")

        def run_chunk(strategy: Any, n: int, positive: bool) -> None:
            @settings(max_examples=n, deadline=None, database=None, derandomize=derandomize,
                      phases=[Phase.explicit, Phase.generate], verbosity=Verbosity.quiet,
                      suppress_health_check=list(HealthCheck))
            @given(case=strategy, named=st.booleans())
            def fuzz(case: Any, named: bool) -> None:
                check(case, named, positive)

            fuzz()

        for op in schema.get_all_operations():
            if not isinstance(op, Ok):
                continue
            operation = op.ok()
            for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
                strategy = operation.as_strategy(generation_mode=mode)
                done = 0
                while done < max_examples and time.monotonic() < deadline:
                    n = max_examples - done if derandomize else min(chunk, max_examples - done)
                    try:
                        run_chunk(strategy, n, mode == schemathesis.GenerationMode.POSITIVE)
                    except Unsatisfiable:  # nothing to negate (an operation without parameters or body)
                        break
                    done += n
    report.seconds = round(time.monotonic() - t0, 2)
    return report
