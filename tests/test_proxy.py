"""The OpenAI-compatible proxy, driven by the official ``openai`` package against uvicorn on loopback, on the
real default model (small ``max_tokens``). The marked-document convention is also checked directly."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import openai
import pytest

from compressor.errors import InputError
from serving.app import ProxySettings, create_app, serve_in_thread
from serving.documents import extract_chat, render_chat

MODEL = "smollm2-135m-instruct"
HAMLET = ("Hamlet is a tragedy written by William Shakespeare around 1600. It is set in Denmark. The play is long. "
          "Many actors have played the prince.")
CATS = "Cats sleep for most of the day. They purr when content. Some cats like water."
DOCS = [{"title": "Hamlet", "text": HAMLET}, CATS]
QUESTION = "Who wrote Hamlet?"


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def client(base: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def proxy(smol_backend) -> Iterator[str]:
    with serve_in_thread(create_app(ProxySettings(method="bm25", ratio=2.0), backend=smol_backend)) as base:
        yield base


@pytest.fixture(scope="module")
def oa(proxy) -> openai.OpenAI:
    return client(proxy)


def ask(oa: openai.OpenAI, content: str = QUESTION, **kw):
    return oa.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=8,
                                      temperature=0, **kw)


# -- through the openai client ------------------------------------------------------------------------------
def test_models_list(oa):
    assert [m.id for m in oa.models.list().data] == [MODEL]


def test_chat_matches_the_decoder_called_directly(oa, smol_backend):
    r = ask(oa, "Say hello.")
    from adapters import GenerationParams
    from compressor import Prompt

    tok = smol_backend.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": "Say hello."}], tokenize=False,
                                   add_generation_prompt=True)
    direct = smol_backend.generate([Prompt(segments=[tok(text, add_special_tokens=False)["input_ids"]])],
                                   GenerationParams(max_new_tokens=8))[0]
    assert r.object == "chat.completion" and r.model == MODEL and r.id.startswith("chatcmpl-")
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == direct.text
    assert r.usage.prompt_tokens == direct.prompt_tokens and r.usage.completion_tokens == len(direct.token_ids)
    assert r.choices[0].finish_reason == direct.finish_reason
    assert r.compression["documents"] == 0 and r.compression["method"] == "bm25"


def test_chat_streamed_joins_to_the_plain_answer(oa):
    plain = ask(oa, "Name a color.")
    chunks = list(ask(oa, "Name a color.", stream=True, stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].compression["enabled"] is True
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [plain.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_wire_format_is_openai_sse(proxy):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": True,
            "temperature": 0}
    r = httpx.post(f"{proxy}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = r.text.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    assert all(e.startswith("data: {") for e in events[:-2])


def test_completions_plain_and_streamed(oa):
    r = oa.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=5, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text and r.usage.completion_tokens <= 5
    parts = list(oa.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=5,
                                       temperature=0, stream=True))
    assert "".join(p.choices[0].text for p in parts if p.choices) == r.choices[0].text


def test_extra_body_documents_compressed_and_compression_off(oa):
    on = ask(oa, extra_body={"documents": DOCS})
    off = ask(oa, extra_body={"documents": DOCS, "compression": {"enabled": False}})
    c = on.compression
    assert c["documents"] == 2 and c["method"] == "bm25" and c["compression_ms"] >= 0
    assert c["tokens_after"] <= c["tokens_before"] // 2 and c["ratio"] >= 2
    assert off.compression["enabled"] is False and off.compression["tokens_after"] == c["tokens_before"]
    saved = c["tokens_before"] - c["tokens_after"]
    assert off.usage.prompt_tokens - on.usage.prompt_tokens >= saved - 2  # the decoder saw the shorter context
    tight = ask(oa, extra_body={"documents": DOCS, "compression": {"target_tokens": 12}})
    assert tight.compression["tokens_after"] <= 12


def test_marked_documents_in_messages(oa):
    content = (f'Answer in a few words.\n<document title="Hamlet">{HAMLET}</document>\n<document>{CATS}</document>'
               f"\nQuestion: {QUESTION}")
    on = ask(oa, content)
    off = ask(oa, content, extra_body={"compression": {"enabled": False}})
    assert on.compression["documents"] == 2 and on.compression["tokens_after"] < on.compression["tokens_before"]
    assert on.usage.prompt_tokens < off.usage.prompt_tokens


def test_bad_method_is_a_clear_400(oa):
    with pytest.raises(openai.BadRequestError) as e:
        ask(oa, extra_body={"documents": DOCS, "compression": {"method": "nope"}})
    err = e.value.body
    assert e.value.status_code == 400 and err["param"] == "compression.method" and err["code"] == "unknown_method"
    assert "'nope'" in err["message"] and "bm25" in err["message"] and "minilm" in err["message"]


def test_strict_extensions(oa):
    with pytest.raises(openai.BadRequestError, match="compression.ratio_typo"):
        ask(oa, extra_body={"compression": {"ratio_typo": 3}})
    with pytest.raises(openai.BadRequestError, match="documents.0"):
        ask(oa, extra_body={"documents": [{"text": "x", "body": "y"}]})


def test_unknown_model_route_and_size_limits(oa, proxy, smol_backend):
    with pytest.raises(openai.NotFoundError) as e:
        oa.chat.completions.create(model="gpt-nope", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    assert e.value.body["code"] == "model_not_found"
    r = httpx.get(f"{proxy}/v1/nothing-here", timeout=10)
    assert r.status_code == 404 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    with serve_in_thread(create_app(ProxySettings(max_body_bytes=2048), backend=smol_backend)) as small:
        with pytest.raises(openai.APIStatusError) as e:
            ask(client(small), "x" * 5000)
        assert e.value.status_code == 413 and e.value.body["code"] == "request_too_large"


def test_api_keys(smol_backend):
    with serve_in_thread(create_app(ProxySettings(api_keys=["k-one", "k-two"]), backend=smol_backend)) as base:
        with pytest.raises(openai.AuthenticationError) as e:
            client(base, "wrong").models.list()
        assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
        r = httpx.get(f"{base}/v1/models", timeout=10)  # no Authorization header at all
        assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key"
        assert r.headers["www-authenticate"] == "Bearer"
        assert [m.id for m in client(base, "k-two").models.list().data] == [MODEL]
        assert httpx.get(f"{base}/health", timeout=10).json()["status"] == "ok"  # health stays open


def test_upstream_down_is_502_in_openai_shape(smol_backend):
    settings = ProxySettings(upstream=f"http://127.0.0.1:{closed_port()}/v1", timeout_s=5)
    with serve_in_thread(create_app(settings, backend=smol_backend)) as base:
        with pytest.raises(openai.APIStatusError) as e:
            ask(client(base))
        assert e.value.status_code == 502
        assert e.value.response.json()["error"]["type"] == "upstream_error"
        assert e.value.body["code"] == "upstream_unavailable"


def test_upstream_timeout_is_504(smol_backend):
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("no answer", request=request)

    app = create_app(ProxySettings(upstream="http://upstream.invalid/v1"), backend=smol_backend,
                     transport=httpx.MockTransport(slow))
    with serve_in_thread(app) as base:
        with pytest.raises(openai.APIStatusError) as e:
            ask(client(base))
        assert e.value.status_code == 504 and e.value.body["type"] == "timeout_error"


def test_remote_upstream_is_a_second_proxy(proxy, oa, smol_backend):
    settings = ProxySettings(upstream=f"{proxy}/v1", method="bm25", ratio=2.0)
    with serve_in_thread(create_app(settings, backend=smol_backend)) as front:
        fo = client(front)
        assert [m.id for m in fo.models.list().data] == [MODEL]
        r = ask(fo, extra_body={"documents": DOCS})
        direct = ask(oa, extra_body={"documents": DOCS})
        assert r.choices[0].message.content == direct.choices[0].message.content
        assert r.compression["documents"] == 2 and r.usage.prompt_tokens == direct.usage.prompt_tokens
        chunks = list(ask(fo, extra_body={"documents": DOCS}, stream=True))
        assert chunks[0].compression["documents"] == 2
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content
        with pytest.raises(openai.NotFoundError):  # the upstream's own 404 is relayed
            fo.chat.completions.create(model="gpt-nope", messages=[{"role": "user", "content": "x"}], max_tokens=2)


def test_metrics_count_requests_and_tokens_saved(proxy, oa):
    ask(oa, extra_body={"documents": DOCS})
    text = httpx.get(f"{proxy}/metrics", timeout=10).text
    assert 'ragpress_requests_total{endpoint="/v1/chat/completions",status="200"}' in text
    saved = next(line for line in text.splitlines() if line.startswith("ragpress_tokens_saved_total"))
    assert int(saved.split()[-1]) > 0
    assert 'ragpress_request_seconds{endpoint="/v1/chat/completions",quantile="0.95"}' in text


# -- the marked-document convention, directly ----------------------------------------------------------------
def test_marked_blocks_shortened_in_place_rest_untouched(counter):
    from compressor import get_compressor

    before, between, after = "Be brief.\n", "\nAlso:\n", f"\nQuestion: {QUESTION}"
    msgs = [{"role": "system", "content": "You answer questions."},
            {"role": "user", "content": f'{before}<document title="Hamlet" id="h">{HAMLET}</document>{between}'
                                        f"<document>{CATS}</document>{after}"}]
    docs = extract_chat(msgs, None)
    assert docs.query == f"{before}{between}{after}".strip() and len(docs) == 2
    assert docs.marked[0].passage.title == "Hamlet" and docs.marked[0].passage.id == "h"
    ctx = get_compressor("bm25", counter=counter).compress(docs.query, docs.passages, {"target_tokens": 15})
    out = render_chat(msgs, docs, ctx)
    assert out[0] == msgs[0]
    content = out[1]["content"]
    assert content.startswith(before + '<document title="Hamlet" id="h">') and content.endswith(after)
    kept = content[len(before) + len('<document title="Hamlet" id="h">'): content.index("</document>")]
    assert kept == ctx.passages[0].text and len(kept) < len(HAMLET)
    assert [p.index for p in ctx.passages] == [0] and "Cats" not in content  # dropped document: tags and all
    assert render_chat(msgs, docs, None) == msgs  # compression off: byte for byte


def test_marked_blocks_bad_markup(counter):
    with pytest.raises(InputError, match="not closed"):
        extract_chat([{"role": "user", "content": "Q? <document>text"}], None)
    with pytest.raises(InputError, match="'name'"):
        extract_chat([{"role": "user", "content": 'Q? <document name="x">text</document>'}], None)
    with pytest.raises(InputError, match="no question"):
        extract_chat([{"role": "user", "content": "<document>text</document>"}], None)


# -- the streaming hook the proxy uses (adapters.decoders) ---------------------------------------------------
def test_backend_stream_deltas_join_to_generate_with_stop_strings(tiny_backend):
    from adapters import GenerationParams
    from compressor import Prompt

    prompt = Prompt(segments=[list(range(5, 25))])
    full = tiny_backend.generate([prompt], GenerationParams(max_new_tokens=24))[0].text
    assert len(full) >= 12, full
    for stop in (full[6:9], full[-3:], "never-there"):
        params = GenerationParams(max_new_tokens=24, stop=[stop])
        want = tiny_backend.generate([prompt], params)[0]
        deltas: list[str] = []
        got = tiny_backend.stream(prompt, params, on_delta=deltas.append)
        assert "".join(deltas) == got.text == want.text and got.finish_reason == want.finish_reason
        assert all(stop not in "".join(deltas[: i + 1]) for i in range(len(deltas)))
