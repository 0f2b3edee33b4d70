"""The proxy's OpenAPI document (``GET /openapi.json``), built from the wire models in :mod:`serving.protocol`.

The routes read their bodies themselves (to enforce the size limit before parsing), so FastAPI cannot infer
the request schemas; this module states them, with every error status the proxy answers and its
OpenAI-shaped body. It is what ``schemathesis`` fuzzes (:mod:`serving.harden.fuzz`).
"""

from __future__ import annotations

from typing import Any

from pydantic.json_schema import models_json_schema

from .protocol import ChatCompletionRequest, CompletionRequest, CompressionInfo, ErrorResponse

__all__ = ["ERROR_STATUSES", "openapi_schema"]

ERROR_STATUSES = {
    "400": "Bad input: names the field (param) and the fix.",
    "401": "Missing or wrong API key.",
    "404": "Unknown model or route.",
    "413": "Body over --max-body-bytes.",
    "502": "The upstream is unreachable or failed.",
    "504": "The upstream or the in-process decoder did not finish in time.",
}
_REF = "#/components/schemas/{model}"
# One server-sent event: its data is a JSON chunk, an error object, or the closing "[DONE]".
_SSE_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}


def _errors(*statuses: str) -> dict[str, Any]:
    err = {"application/json": {"schema": {"$ref": _REF.format(model="ErrorResponse")}}}
    return {s: {"description": ERROR_STATUSES[s], "content": err} for s in statuses}


def _completion_op(summary: str, model: str) -> dict[str, Any]:
    ok = {"type": "object", "required": ["compression"],
          "properties": {"compression": {"$ref": _REF.format(model="CompressionInfo")}}}
    return {
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": _REF.format(model=model)}}}},
        "responses": {
            "200": {"description": "The upstream's answer with a `compression` block beside `usage`; with "
                                   "`stream: true`, server-sent events.",
                    "content": {"application/json": {"schema": ok}, "text/event-stream": {"schema": _SSE_EVENT}}},
            **_errors("400", "401", "404", "413", "502", "504"),
        },
        "security": [{"bearer": []}, {}],
    }


def openapi_schema(title: str = "ragpress proxy", version: str = "0") -> dict[str, Any]:
    """The OpenAPI 3.1 document of the proxy's endpoints."""
    _, top = models_json_schema(
        [(ChatCompletionRequest, "validation"), (CompletionRequest, "validation"),
         (CompressionInfo, "serialization"), (ErrorResponse, "serialization")],
        ref_template=_REF)
    listing = {"type": "object", "required": ["object", "data"],
               "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": {"type": "object"}}}}
    text = {"text/plain": {"schema": {"type": "string"}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version,
                 "description": "OpenAI-compatible proxy that compresses the documents of each request."},
        "paths": {
            "/v1/chat/completions": {"post": _completion_op("Chat completion with compressed documents",
                                                            "ChatCompletionRequest")},
            "/v1/completions": {"post": _completion_op("Text completion with compressed documents",
                                                       "CompletionRequest")},
            "/v1/models": {"get": {"summary": "Models the upstream serves", "security": [{"bearer": []}, {}],
                                   "responses": {"200": {"description": "OpenAI's model list",
                                                         "content": {"application/json": {"schema": listing}}},
                                                 **_errors("401", "502", "504")}}},
            "/health": {"get": {"summary": "Liveness (open even with API keys)",
                                "responses": {"200": {"description": "ok",
                                                      "content": {"application/json": {"schema": {"type": "object"}}}}}}},
            "/metrics": {"get": {"summary": "Prometheus text", "security": [{"bearer": []}, {}],
                                 "responses": {"200": {"description": "metrics", "content": text},
                                               **_errors("401")}}},
        },
        "components": {"schemas": top["$defs"],
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }
