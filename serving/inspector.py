"""The inspector page: see what a compression kept, in a browser, on the running proxy.

``GET /inspect`` serves one static page (``serving/static/``: HTML, a stylesheet and a script, no build step and
nothing fetched from elsewhere, so it works offline). The page reads ``/inspect/config`` (the methods served
here) and ``/inspect/examples`` (bundled benchmark questions), posts to ``/inspect/compress`` (compress only,
with the explanation: :meth:`~serving.handler.ProxyHandler.inspect`) and, to answer, to
``/v1/chat/completions`` twice: full context (``compression.enabled: false``) and compressed.

Same keys as the API. Where keys are set, the page routes answer 401 with a ``Basic`` challenge, so a browser
asks for the key (any user name, the key as password); the API accepts that header too, and the page also
takes a key typed into it (sent as ``Bearer``). ``--no-inspector`` leaves every route here out.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response

from .handler import ProxyHandler
from .protocol import ProxyError
from .settings import ProxySettings

__all__ = ["add_inspector", "STATIC"]

STATIC = Path(__file__).parent / "static"
_TYPES = {"inspect.html": "text/html; charset=utf-8", "inspect.js": "text/javascript; charset=utf-8",
          "inspect.css": "text/css; charset=utf-8", "examples.json": "application/json"}
# Only this origin's own files: no inline script, no CDN, no framing by another site.
_HEADERS = {"Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' "
            "data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
            "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}


def add_inspector(app: FastAPI, handler: ProxyHandler, settings: ProxySettings,
                  check_key: Callable[[Request], None]) -> list[Any]:
    """Add the inspector's page and read-only routes to ``app``, behind ``check_key`` (the API's key check);
    return the routes' dependencies (a Basic challenge where a key is missing), for ``/inspect/compress``, which
    the app adds with its other JSON routes."""
    files = {name: (STATIC / name).read_bytes() for name in _TYPES}  # read once: a missing file fails at start-up

    def page_key(request: Request) -> None:
        try:
            check_key(request)
        except ProxyError as e:  # a browser shows its login prompt for a Basic challenge
            e.headers = {"WWW-Authenticate": 'Basic realm="ragpress inspector", charset="UTF-8"'}
            raise

    secured = [Depends(page_key)]

    def static(name: str) -> Callable[[], Any]:
        async def serve_file() -> Response:
            return Response(files[name], media_type=_TYPES[name], headers=_HEADERS)
        return serve_file

    for path, name in (("/inspect", "inspect.html"), ("/inspect/inspect.js", "inspect.js"),
                       ("/inspect/inspect.css", "inspect.css"), ("/inspect/examples", "examples.json")):
        app.add_api_route(path, static(name), methods=["GET"], dependencies=secured, include_in_schema=False)

    @app.get("/inspect/config", dependencies=secured, include_in_schema=False)
    async def config() -> dict[str, Any]:
        return {"methods": handler.served_methods(), "method": settings.method, "ratio": settings.ratio,
                "model": settings.served_model_name or settings.model, "auth": bool(settings.api_keys)}

    return secured
