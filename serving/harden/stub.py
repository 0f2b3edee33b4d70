"""A scriptable OpenAI-compatible upstream on loopback, for fault and load tests.

``StubUpstream().start()`` serves ``/v1/models``, ``/v1/chat/completions`` and ``/v1/completions`` (plain
and streamed) on 127.0.0.1 from a thread. Set :attr:`StubUpstream.mode` to make it misbehave:

=================  ==================================================================================
mode               what the next requests get
=================  ==================================================================================
``ok``             a well-formed answer (stream: three chunks and ``[DONE]``)
``slow``           the same, after :attr:`StubUpstream.delay_s` seconds of silence
``drip``           the same, its body trickled out over :attr:`StubUpstream.delay_s` seconds
``error_500``      500 with an OpenAI-shaped error body
``html_503``       503 with an HTML page
``bad_key``        401: the upstream refuses the proxy's key
``bad_request``    400 with an OpenAI-shaped error (the proxy relays it)
``malformed``      200 whose body is not JSON
``not_object``     200 whose body is a JSON list
``stream_closed``  stream: two chunks, then the connection closes cleanly without ``[DONE]``
``stream_cut``     stream: two chunks, then the connection drops mid-chunk (chunked body never ends)
``stream_garbage`` stream: one chunk, then an event that is not JSON
=================  ==================================================================================

:meth:`stop` takes it down (connection refused); :meth:`start` brings it back on the same port.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["StubUpstream", "MODES"]

MODES = ("ok", "slow", "drip", "error_500", "html_503", "bad_key", "bad_request", "malformed", "not_object",
         "stream_closed", "stream_cut", "stream_garbage")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conns: set[socket.socket] = set()
        self.conns_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.conns_lock:
            self.conns.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.conns_lock:
            self.conns.discard(request)
        super().shutdown_request(request)

    def drop_connections(self) -> None:
        """Close every open (kept-alive) connection, as a crashed server would."""
        with self.conns_lock:
            conns = list(self.conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def handle_error(self, request: Any, client_address: Any) -> None:  # a client that left: not news
        return None


class StubUpstream:
    """An OpenAI-compatible server whose behaviour is set by :attr:`mode` (thread-safe to change)."""

    def __init__(self, model: str = "stub", port: int = 0, delay_s: float = 5.0) -> None:
        self.model = model
        self.mode = "ok"
        self.delay_s = delay_s
        self.port = port
        self.requests = 0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        """The base URL a client takes (``.../v1``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> StubUpstream:
        stub = self

        class Handler(_Handler):
            owner = stub

        self._server = _Server(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server.drop_connections()
            self._server = None

    def __enter__(self) -> StubUpstream:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def count(self) -> None:
        with self._lock:
            self.requests += 1


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a real upstream: the proxy pools connections
    owner: StubUpstream

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return None

    # -- helpers ------------------------------------------------------------------------------------------
    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.owner.mode != "drip":
            self.wfile.write(body)
            return
        pieces = 20  # every gap far shorter than a read timeout; all of them together far longer
        step = max(1, len(body) // pieces + 1)
        for i in range(0, len(body), step):
            self.wfile.write(body[i: i + step])
            self.wfile.flush()
            time.sleep(self.owner.delay_s / pieces)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode())

    def _error(self, status: int, message: str, type_: str, code: str | None = None) -> None:
        self._json(status, {"error": {"message": message, "type": type_, "param": None, "code": code}})

    def _read_body(self) -> dict[str, Any]:
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b"{}"
        try:
            return json.loads(raw)
        except ValueError:
            return {}

    # -- routes ---------------------------------------------------------------------------------------------
    def do_GET(self) -> None:
        self.owner.count()
        if self._misbehave():
            return
        if self.path.rstrip("/") == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": self.owner.model, "object": "model", "created": 0,
                                                         "owned_by": "stub"}]})
        else:
            self._error(404, f"no route {self.path}", "invalid_request_error", "not_found")

    def do_POST(self) -> None:
        self.owner.count()
        body = self._read_body()
        if self._misbehave(stream=bool(body.get("stream"))):
            return
        path = self.path.rstrip("/")
        if path not in ("/v1/chat/completions", "/v1/completions"):
            self._error(404, f"no route {self.path}", "invalid_request_error", "not_found")
            return
        if body.get("model") != self.owner.model:
            self._error(404, f"The model {body.get('model')!r} does not exist", "invalid_request_error",
                        "model_not_found")
            return
        chat = path.endswith("chat/completions")
        size = len(json.dumps(body.get("messages") if chat else body.get("prompt")))
        text = f"stub answer to {size} characters"
        if body.get("stream"):
            self._stream(chat, text)
            return
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"} if chat
                  else {"index": 0, "text": text, "finish_reason": "stop"})
        self._json(200, {"id": "stub-1", "object": "chat.completion" if chat else "text_completion", "created": 0,
                         "model": self.owner.model, "choices": [choice],
                         "usage": {"prompt_tokens": size // 4, "completion_tokens": 5,
                                   "total_tokens": size // 4 + 5}})

    def _misbehave(self, stream: bool = False) -> bool:
        """Act out the current mode; True when the response is done."""
        mode = self.owner.mode
        if mode == "slow":
            time.sleep(self.owner.delay_s)
            return False
        if mode == "error_500":
            self._error(500, "stub upstream exploded", "server_error", "internal_error")
        elif mode == "html_503":
            self._send(503, b"<html><body>Service Unavailable</body></html>", "text/html")
        elif mode == "bad_key":
            self._error(401, "Incorrect API key provided", "invalid_request_error", "invalid_api_key")
        elif mode == "bad_request":
            self._error(400, "max_tokens is too large for the stub", "invalid_request_error", "invalid_value")
        elif mode == "malformed":
            self._send(200, b'{"id": "stub-1", "choices": [', "application/json")
        elif mode == "not_object":
            self._send(200, b"[1, 2, 3]", "application/json")
        elif mode.startswith("stream_") and stream:
            self._broken_stream(mode)
        else:
            return False
        return True

    # -- streams --------------------------------------------------------------------------------------------
    def _event(self, chat: bool, text: str | None, finish: str | None = None) -> dict[str, Any]:
        if chat:
            delta = {"content": text} if text is not None else {}
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish}
        return {"id": "stub-1", "object": "chat.completion.chunk" if chat else "text_completion", "created": 0,
                "model": self.owner.model, "choices": [choice]}

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _stream(self, chat: bool, text: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for piece in (text[: len(text) // 2], text[len(text) // 2:]):
            self._chunk(f"data: {json.dumps(self._event(chat, piece))}\n\n".encode())
        self._chunk(f"data: {json.dumps(self._event(chat, None, 'stop'))}\n\n".encode())
        self._chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _broken_stream(self, mode: str) -> None:
        chat = self.path.rstrip("/").endswith("chat/completions")
        first = f"data: {json.dumps(self._event(chat, 'half an '))}\n\n".encode()
        second = f"data: {json.dumps(self._event(chat, 'answer'))}\n\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        if mode == "stream_closed":  # body delimited by the connection: a clean close ends it
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(first + second)
            self.wfile.flush()
            self.close_connection = True
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._chunk(first)
        if mode == "stream_garbage":
            self._chunk(b"data: {this is not json\n\n")
            self._chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            return
        self._chunk(second)  # stream_cut: half a chunk, then the socket drops
        self.wfile.write(b"40\r\ndata: {\"trunc")
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_RDWR)
        self.close_connection = True
