"""Bad input, limits and security of the proxy, in-process on a fake decoder (fast; no model).

Every refused request must be a 4xx with exactly ``{"error": {"message", "type", "param", "code"}}`` naming
the field; pathological input must be answered quickly; keys and bodies must never reach a log."""

from __future__ import annotations

import hmac
import json
import time

import pytest
from fastapi.testclient import TestClient

from adapters.decoders import FakeBackend
from serving.app import ProxySettings, create_app

M = "fake"
Q = "Who wrote Hamlet?"
HAMLET = "Hamlet is a tragedy written by William Shakespeare. It is set in Denmark. The prince is called Hamlet."
CATS = "Cats sleep for most of the day. They purr when content. Some cats like water."
ERROR_KEYS = {"message", "type", "param", "code"}


def make_client(tokenizer, **settings) -> tuple[TestClient, FakeBackend]:
    backend = FakeBackend(tokenizer, model_name=M)
    app = create_app(ProxySettings(served_model_name=M, method="bm25", ratio=2.0, **settings), backend=backend)
    return TestClient(app, raise_server_exceptions=False), backend


@pytest.fixture(scope="module")
def fake(smol_tokenizer):
    return make_client(smol_tokenizer)


def chat(content: str = Q, **kw) -> dict:
    return {"model": M, "messages": [{"role": "user", "content": content}], "max_tokens": 4, **kw}


def post(client: TestClient, body, path: str = "/v1/chat/completions"):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(path, content=raw, headers={"content-type": "application/json"})


def assert_error(r, status: int, param: str | None = None, code: str | None = None, says: str = "") -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == ERROR_KEYS, body
    err = body["error"]
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str)
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    assert says in err["message"], err["message"]
    return err


def _deep(levels: int) -> bytes:
    return b'{"model":"fake","messages":' + b"[" * levels + b"]" * levels + b"}"


BAD = [
    # (id, body, path, status, param, code, message says)
    ("not utf-8", b'{"model":"fake","messages":[{"role":"user","content":"caf\xe9"}]}', None, 400, None,
     "invalid_encoding", "not valid UTF-8 (byte 0xe9 at offset"),
    ("not json", b'{"model": "fake", "messages": [', None, 400, None, "invalid_json", "not valid JSON"),
    ("json array", b"[1, 2]", None, 400, None, "invalid_json", "must be a JSON object, not a JSON list"),
    ("nested past the parser", _deep(100_000), None, 400, None, "invalid_json", "nests too deeply"),
    ("nested past the limit", json.dumps(chat(extra=json.loads("[" * 80 + "]" * 80))).encode(), None, 400, None,
     "invalid_json", "deeper than 64 levels"),
    ("integer of 5000 digits", b'{"model":"fake","messages":[],"seed":' + b"9" * 5000 + b"}", None, 400, None,
     "invalid_json", "integer too long"),
    ("lone surrogate in a message", chat("Who \ud800?"), None, 400, "messages.0.content", "invalid_encoding",
     "unpaired UTF-16 surrogate (\\ud800)"),
    ("lone surrogate in a document", chat(documents=["ok", "bad \udc00 text."]), None, 400, "documents.1",
     "invalid_encoding", "surrogate"),
    ("lone surrogate in a key", {**chat(), "x\ud801": 1}, None, 400, "<key>", "invalid_encoding", "surrogate"),
    ("control character in a document", chat(documents=[HAMLET, "Cats\x00 sleep."]), None, 400, "documents",
     "invalid_text", "documents[1] text holds the control character U+0000 at character 4"),
    ("control character in a marked document", chat(f"<document>Esc \x1b[31m red.</document> {Q}"), None, 400,
     "documents", "invalid_text", "messages[0].content, <document> block 0 text holds the control character U+001B"),
    ("blank document", chat(documents=[HAMLET, "   \n\t "]), None, 400, None, None, "documents[1] is blank"),
    ("empty document", chat(documents=[{"title": "x", "text": ""}]), None, 400, None, None, "documents[0] is blank"),
    ("documents not a list", chat(documents="Hamlet"), None, 400, "documents", None, "valid list"),
    ("document of the wrong type", chat(documents=[3]), None, 400, "documents.0", None, "valid string"),
    ("unknown document field", chat(documents=[{"text": HAMLET, "body": "x"}]), None, 400, "documents.0.body",
     None, "Extra inputs"),
    ("messages not a list", {"model": M, "messages": "hi"}, None, 400, "messages", None, "valid list"),
    ("role of the wrong type", {"model": M, "messages": [{"role": 1, "content": "x"}]}, None, 400,
     "messages.0.role", None, "valid string"),
    ("unknown method", chat(documents=[HAMLET], compression={"method": "nope"}), None, 400, "compression.method",
     "unknown_method", "registered compressors are"),
    ("ratio below 1", chat(documents=[HAMLET], compression={"ratio": 0.5}), None, 400, "compression.ratio", None,
     "greater than or equal to 1"),
    ("ratio above 1000", chat(documents=[HAMLET], compression={"ratio": 5000}), None, 400, "compression.ratio",
     None, "less than or equal to 1000"),
    ("ratio of the wrong type", chat(documents=[HAMLET], compression={"ratio": "x"}), None, 400,
     "compression.ratio", None, "valid number"),
    ("ratio and target_tokens", chat(documents=[HAMLET], compression={"ratio": 2, "target_tokens": 5}), None, 400,
     "compression", None, "not both"),
    ("unknown compression field", chat(compression={"ratio_typo": 3}), None, 400, "compression.ratio_typo", None,
     "Extra inputs"),
    ("NaN temperature", b'{"model":"fake","messages":[{"role":"user","content":"x"}],"temperature":NaN}', None,
     400, "temperature", None, "less than or equal to 2"),
    ("seed over 64 bits", chat(seed=2**70), None, 400, "seed", None, "less than or equal to"),
    ("max_tokens over the decoder's", chat(max_tokens=10**9), None, 400, "max_tokens", "invalid_value",
     "lower it"),
    ("empty prompt list", {"model": M, "prompt": []}, "/v1/completions", 400, None, None, "empty list"),
]


@pytest.mark.parametrize("body, path, status, param, code, says", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_is_an_openai_error_naming_the_field(fake, body, path, status, param, code, says):
    client, _ = fake
    assert_error(post(client, body, path or "/v1/chat/completions"), status, param, code, says)


def test_document_count_and_token_limits(smol_tokenizer):
    client, _ = make_client(smol_tokenizer, max_documents=3, max_document_tokens=60, max_sentence_tokens=16)
    assert post(client, chat(documents=[HAMLET, CATS, "Dogs bark."])).status_code == 200  # at the limit
    assert_error(post(client, chat(documents=[HAMLET, CATS, "Dogs bark.", "Birds sing."])), 400, "documents",
                 "too_many_documents", "the request has 4 documents; this proxy takes at most 3")
    marked = "".join(f"<document>Fact {i} is true.</document>" for i in range(4))  # marked ones count too
    assert_error(post(client, chat(f"{marked} {Q}")), 400, "documents", "too_many_documents", "4 documents")
    assert_error(post(client, {"model": M, "prompt": ["a?", "b?"], "documents": [HAMLET, CATS]},
                      "/v1/completions"), 400, "documents", "too_many_documents", "2 prompts x 2 body documents")
    assert_error(post(client, chat(documents=[HAMLET * 3])), 400, "documents", "documents_too_long",
                 "more than 60 tokens (reached at documents[0])")
    # the token limit holds with compression off too (it bounds the work of a request)...
    assert_error(post(client, chat(documents=[HAMLET * 3], compression={"enabled": False})), 400, "documents",
                 "documents_too_long")
    # ...the sentence limit only where sentences are scored
    long_sentence = "Hamlet " + "and the prince " * 8 + "is a play."
    assert_error(post(client, chat(documents=[long_sentence])), 400, "documents", "sentence_too_long",
                 "documents[0] has a sentence of")
    assert post(client, chat(documents=[long_sentence], compression={"enabled": False})).status_code == 200


def test_control_characters_pass_when_compression_is_off(fake):
    client, backend = fake
    r = post(client, chat(documents=["Cats\x00 sleep."], compression={"enabled": False}))
    assert r.status_code == 200 and r.json()["compression"]["enabled"] is False
    ok = post(client, chat(documents=["Tabs\tand\nline\r\nbreaks\fand form feeds are fine."]))
    assert ok.status_code == 200, ok.text


def test_budget_over_the_input_is_a_documented_pass_through(fake, smol_tokenizer):
    client, backend = fake
    r = post(client, chat(documents=[HAMLET, {"title": "Cats", "text": CATS}], compression={"target_tokens": 10**6}))
    c = r.json()["compression"]
    assert r.status_code == 200 and c["tokens_after"] == c["tokens_before"] > 0 and c["ratio"] == 1.0
    prompt = smol_tokenizer.decode(backend.calls[-1].token_ids)
    assert HAMLET in prompt and CATS in prompt  # nothing dropped, nothing truncated


def test_one_sentence_over_the_budget_is_dropped_not_cut(fake):
    client, backend = fake
    sentence = "Hamlet " + "and the prince of Denmark " * 40 + "is a play by Shakespeare."
    r = post(client, chat(documents=[sentence, CATS], compression={"target_tokens": 20}))
    c = r.json()["compression"]
    assert r.status_code == 200 and 0 < c["tokens_after"] <= 20 < c["tokens_before"]


def test_pathological_input_is_answered_fast(fake):
    """Inputs that were quadratic: pysbd's span search ("Ab. " x 10,000 took 13 s) and the marked-document
    regex (160 KB of unclosed "<document>" took 12 s, on the event loop)."""
    client, _ = fake
    t0 = time.perf_counter()
    r = post(client, chat(documents=["Ab. " * 10_000], compression={"target_tokens": 50}))
    assert r.status_code == 200 and r.json()["compression"]["tokens_after"] <= 50
    assert time.perf_counter() - t0 < 8
    t0 = time.perf_counter()
    assert_error(post(client, chat("<document>" * 50_000 + Q)), 400, says="not closed")
    assert time.perf_counter() - t0 < 3


def test_bm25_survives_documents_of_stop_words_only(fake):
    """Found by the fuzzer: bm25s cannot index a corpus with no terms (it raised, a 500)."""
    client, _ = fake
    r = post(client, chat(documents=["}", "{", "It is."], compression={"ratio": 2}))
    assert r.status_code == 200, r.text


def test_openapi_document_describes_the_endpoints(fake):
    client, _ = fake
    doc = client.get("/openapi.json").json()
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"} <= set(doc["paths"])
    schemas = doc["components"]["schemas"]
    assert {"ChatCompletionRequest", "CompletionRequest", "ErrorResponse", "CompressionInfo"} <= set(schemas)
    assert schemas["CompressionOptions"]["additionalProperties"] is False  # our extension: strict
    assert schemas["ChatCompletionRequest"]["additionalProperties"] is True  # OpenAI's fields: pass through
    chat_op = doc["paths"]["/v1/chat/completions"]["post"]
    assert {"400", "401", "404", "413", "502", "504"} <= set(chat_op["responses"])


# -- security ---------------------------------------------------------------------------------------------------
def test_api_keys_compared_in_constant_time_against_every_key(smol_tokenizer, monkeypatch):
    calls, real = [], hmac.compare_digest

    def spy(a, b):
        calls.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr("serving.app.hmac.compare_digest", spy)
    client, _ = make_client(smol_tokenizer, api_keys=["k-one", "k-two-longer", "k-three"])
    for key, status in (("wrong", 401), ("k-one", 200), ("k-three", 200)):
        calls.clear()
        r = client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == status
        assert len(calls) == 3  # every key, whichever matched: no early exit to time
        if status == 401:
            assert "wrong" not in r.text  # never echoed


def test_keys_and_bodies_never_reach_the_logs(smol_tokenizer, capfd, caplog, monkeypatch):
    """uvicorn with serve()'s log level (info, access log on), a request with a secret key and a secret
    body, a refused one and one with a wrong key: neither secret is written anywhere."""
    import logging

    import httpx
    import uvicorn

    from serving.app import serve_in_thread

    key, secret = "sk-very-secret-key-123", "TOP-SECRET-DOCUMENT-TEXT"
    settings = ProxySettings(served_model_name=M, api_keys=[key])
    assert key not in repr(settings) and key not in str(settings)
    app = create_app(settings, backend=FakeBackend(smol_tokenizer))
    caplog.set_level(logging.DEBUG)
    config = uvicorn.Config
    monkeypatch.setattr(uvicorn, "Config", lambda app, **kw: config(app, **{**kw, "log_level": "info"}))
    with serve_in_thread(app) as base:
        h = {"Authorization": f"Bearer {key}"}
        ok = httpx.post(f"{base}/v1/chat/completions", headers=h, timeout=30,
                        json=chat(documents=[f"{secret} is here. {HAMLET}"]))
        bad = httpx.post(f"{base}/v1/chat/completions", headers=h, timeout=30, json=chat(documents=[f"{secret}\x00"]))
        wrong = httpx.get(f"{base}/v1/models", headers={"Authorization": f"Bearer {key}x"}, timeout=30)
    assert ok.status_code == 200 and bad.status_code == 400 and wrong.status_code == 401
    out = capfd.readouterr()
    logged = out.out + out.err + "\n".join(r.getMessage() for r in caplog.records)
    assert "POST /v1/chat/completions" in logged  # the access log was on: the test can see a leak
    assert key not in logged and secret not in logged


def test_upstream_password_and_key_stay_out_of_errors(smol_tokenizer):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    client, _ = make_client(smol_tokenizer, upstream=f"http://user:hunter2@127.0.0.1:{port}/v1",
                            upstream_api_key="sk-upstream-secret", timeout_s=2)
    err = assert_error(post(client, {"model": "m", "messages": [{"role": "user", "content": "x"}]}), 502,
                       code="upstream_unavailable")
    assert "hunter2" not in err["message"] and "user:***@127.0.0.1" in err["message"]
    assert "sk-upstream-secret" not in err["message"]
