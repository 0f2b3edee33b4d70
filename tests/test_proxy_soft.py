"""Soft methods through the proxy's door: the shipped ICAE encoder's memory slots reach the decoder as embeddings,
through the official openai client, with the embedded decoder and with a prompt-embeds upstream, and the answers
equal the Python API's (:meth:`adapters.RAGPipeline.chat`, greedy) for the same request.

The prompt-embeds upstream is a stub here that answers from the embeddings it is sent, with the same decoder
(``make test-vllm`` runs a real vLLM server); an upstream that takes text only gets a clear 400."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from adapters import RAGPipeline
from adapters.decoders import GenerationParams
from adapters.decoders.remote import decode_embeds
from compressor import Budget
from compressor.prompt import Prompt
from serving.app import ProxySettings, create_app, serve_in_thread

MODEL = "smollm2-135m-instruct"
DOCS = [{"title": "Hamlet", "text": "Hamlet is a tragedy written by William Shakespeare around 1600. It is set in "
                                    "Denmark, at the royal castle of Elsinore."},
        {"title": "Cats", "text": "Cats sleep for most of the day. They purr when they are content."}]
QUESTION = "Who wrote Hamlet?"
MAX_TOKENS = 12


def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)


def ask(oa: openai.OpenAI, docs=DOCS, question=QUESTION, method="icae", **kw):
    compression = {"method": method, **kw.pop("compression", {})}
    return oa.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}],
                                      max_tokens=MAX_TOKENS, temperature=0,
                                      extra_body={"documents": docs, "compression": compression}, **kw)


@pytest.fixture(scope="module")
def pipe(smol_backend) -> RAGPipeline:
    return RAGPipeline(decoder=smol_backend, method="icae", params=GenerationParams(max_new_tokens=MAX_TOKENS))


@pytest.fixture(scope="module")
def proxy(smol_backend) -> Iterator[str]:
    with serve_in_thread(create_app(ProxySettings(method="bm25"), backend=smol_backend)) as base:
        yield base


@pytest.mark.real_model
def test_icae_through_the_openai_client_equals_the_python_api(proxy, pipe):
    oa = client(proxy)
    r = ask(oa)
    want = pipe.chat([{"role": "user", "content": QUESTION}], DOCS)
    block = r.model_extra["compression"]
    assert r.choices[0].message.content.strip() == want.text and want.text, (r.choices[0].message.content, want.text)
    assert (block["method"], block["kind"], block["tokens_after"]) == ("icae", "soft", want.tokens_out)
    assert block["tokens_before"] == want.tokens_in and block["ratio"] == pytest.approx(want.ratio)
    assert r.usage.prompt_tokens == want.prompt_tokens  # slots count as prompt tokens
    chunks = list(ask(oa, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].model_extra["compression"]["kind"] == "soft"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content
    assert chunks[-1].usage.prompt_tokens == want.prompt_tokens
    stop = ask(oa, stop=["Shake"])  # stop sequences hold as for text methods
    assert "Shake" not in stop.choices[0].message.content and stop.choices[0].finish_reason == "stop"


@pytest.mark.real_model
def test_the_composition_is_served_too(proxy, smol_backend):
    """sentinel+icae: the filter's sentences as slots, the same answer as the Python API."""
    pipe = RAGPipeline(decoder=smol_backend, method="sentinel+icae", params=GenerationParams(max_new_tokens=MAX_TOKENS))
    r = ask(client(proxy), method="sentinel+icae", compression={"ratio": 8})
    want = pipe.chat([{"role": "user", "content": QUESTION}], DOCS, Budget(ratio=8))
    block = r.model_extra["compression"]
    assert r.choices[0].message.content.strip() == want.text and block["method"] == "sentinel+icae"
    assert block["kind"] == "soft" and block["tokens_after"] == want.tokens_out and block["asked_ratio"] == 8


@pytest.mark.real_model
def test_a_five_token_document_at_ratio_4_is_answered_and_strict_refuses_it(proxy, smol_backend):
    """A target rounds: 5 tokens cannot be 1 slot, so they become 2 and the block says granularity; a strict
    budget is a 400 naming the ratio icae reaches."""
    oa = client(proxy)
    doc = [{"title": "Capital", "text": "The capital is Paris."}]
    assert len(smol_backend.tokenizer(doc[0]["text"], add_special_tokens=False)["input_ids"]) == 5
    r = ask(oa, docs=doc, question="What is the capital of France?", compression={"ratio": 4})
    block = r.model_extra["compression"]
    assert block["stopped_by"] == "granularity" and block["asked_ratio"] == 4 and block["ratio"] == 2.5, block
    assert r.choices[0].message.content.strip()
    with pytest.raises(openai.BadRequestError) as e:
        ask(oa, docs=doc, question="What is the capital of France?", compression={"ratio": 4, "strict": True})
    err = e.value.body
    assert err["code"] == "budget_unreachable" and "ask for ratio <= " in err["message"] and "strict" in err["message"]


@pytest.mark.real_model
def test_marked_documents_on_the_completions_route(proxy, smol_backend):
    """A <document> block in a completion prompt becomes slots in place; the text around it stays text."""
    oa = client(proxy)
    prompt = f"<document title=\"Hamlet\">{DOCS[0]['text']}</document>\nQuestion: {QUESTION}\nAnswer:"
    r = oa.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0,
                              extra_body={"compression": {"method": "icae"}})
    block = r.model_extra["compression"]
    assert block["kind"] == "soft" and block["documents"] == 1 and block["tokens_after"] < block["tokens_before"]
    assert r.usage.prompt_tokens < len(smol_backend.tokenizer(prompt)["input_ids"])


def _embeds_stub(backend, seen: list[dict]) -> httpx.MockTransport:
    """A prompt-embeds upstream: decodes the tensor it is sent and answers from it with ``backend``."""

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        if request.url.path.endswith("/chat/completions"):  # text methods: a plain chat answer
            return httpx.Response(200, json={"id": "chatcmpl-1", "object": "chat.completion", "model": MODEL,
                                             "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                                          "finish_reason": "stop"}]})
        assert request.url.path.endswith("/v1/completions"), request.url.path
        x = decode_embeds(body["prompt_embeds"])
        g = backend.generate([Prompt(segments=[x])], GenerationParams(max_new_tokens=body.get("max_tokens", 16)))[0]
        if not body.get("stream"):
            return httpx.Response(200, json={"id": "cmpl-1", "object": "text_completion", "model": MODEL,
                                             "choices": [{"index": 0, "text": g.text, "finish_reason": g.finish_reason}],
                                             "usage": {"prompt_tokens": x.shape[0], "completion_tokens": len(g.token_ids),
                                                       "total_tokens": x.shape[0] + len(g.token_ids)}})
        events = [{"id": "cmpl-1", "object": "text_completion", "model": MODEL,
                   "choices": [{"index": 0, "text": g.text, "finish_reason": None}]},
                  {"id": "cmpl-1", "object": "text_completion", "model": MODEL,
                   "choices": [{"index": 0, "text": "", "finish_reason": g.finish_reason}]}]
        sse = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return httpx.Response(200, text=sse, headers={"content-type": "text/event-stream"})

    return httpx.MockTransport(handle)


@pytest.mark.real_model
def test_a_prompt_embeds_upstream_gets_the_same_prompt_as_embeddings(smol_backend, pipe):
    seen: list[dict] = []
    settings = ProxySettings(upstream="http://vllm.invalid/v1", upstream_prompt_embeds=True, method="bm25",
                             default_max_tokens=20)
    with serve_in_thread(create_app(settings, backend=smol_backend, transport=_embeds_stub(smol_backend, seen))) as b:
        oa = client(b)
        r = ask(oa)
        want = pipe.chat([{"role": "user", "content": QUESTION}], DOCS)
        assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
        assert r.choices[0].message.content.strip() == want.text
        body = seen[-1]
        assert "messages" not in body and body["max_tokens"] == MAX_TOKENS and body["model"] == MODEL
        assert decode_embeds(body["prompt_embeds"]).shape[0] == want.prompt_tokens
        chunks = list(ask(oa, stream=True))
        assert chunks[0].object == "chat.completion.chunk" and chunks[0].choices[0].delta.role == "assistant"
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content
        text = ask(oa, compression={"method": "bm25", "ratio": 2})  # text methods still go to the chat route
        assert "messages" in seen[-1] and text.choices
        oa.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}], temperature=0,
                                   extra_body={"documents": DOCS, "compression": {"method": "icae"}})
        assert seen[-1]["max_tokens"] == 20  # the proxy's default, not the completions route's 16


def test_health_lists_the_methods_served_here(proxy):
    methods = httpx.get(f"{proxy}/health", timeout=10).json()["methods"]
    assert "icae" in methods and "sentinel" in methods and "xrag" not in methods  # xrag ships no trained bridge


def test_an_upstream_without_embeddings_gets_a_400_naming_the_text_methods(smol_backend):
    def never(request: httpx.Request) -> httpx.Response:
        raise AssertionError("nothing may reach the upstream")

    settings = ProxySettings(upstream="http://text-only.invalid/v1", method="bm25")
    with serve_in_thread(create_app(settings, backend=smol_backend, transport=httpx.MockTransport(never))) as b:
        with pytest.raises(openai.BadRequestError) as e:
            ask(client(b))
        assert "icae" not in httpx.get(f"{b}/health", timeout=10).json()["methods"]
    err = e.value.body
    assert err["code"] == "unsupported_method" and err["param"] == "compression.method"
    assert "--upstream-prompt-embeds" in err["message"] and "bm25" in err["message"] and "sentinel" in err["message"]


def test_prompt_embeds_needs_a_remote_upstream():
    with pytest.raises(ValueError, match="upstream_prompt_embeds applies to a remote --upstream"):
        ProxySettings(upstream_prompt_embeds=True)


def test_the_budget_options_reach_the_compressor(smol_backend):
    """compression.strict and the asked ratio travel with the request (a text method); a method without its
    artifact here is a 400 naming what is served; a soft default on a text-only upstream fails at start-up."""
    with serve_in_thread(create_app(ProxySettings(method="bm25"), backend=smol_backend)) as b:
        oa = client(b)

        def chat(compression):
            return oa.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                              max_tokens=2, temperature=0,
                                              extra_body={"documents": DOCS, "compression": compression})

        block = chat({"ratio": 3}).model_extra["compression"]
        assert block["asked_ratio"] == 3 and block["kind"] == "text" and block["stopped_by"] == "budget"
        assert Budget(ratio=3).max_tokens(block["tokens_before"]) >= block["tokens_after"]
        assert chat({"target_tokens": 1}).model_extra["compression"]["stopped_by"] == "granularity"
        with pytest.raises(openai.BadRequestError) as e:  # no sentence fits in 1 token: strict refuses
            chat({"target_tokens": 1, "strict": True})
        assert e.value.body["code"] == "budget_unreachable" and e.value.body["param"] == "compression.target_tokens"
        with pytest.raises(openai.BadRequestError) as e:
            chat({"method": "xrag"})
        assert e.value.body["code"] == "method_unavailable" and "icae" in e.value.body["message"]
    from compressor.errors import ConfigError

    with pytest.raises(ConfigError, match="--method icae: .*--upstream-prompt-embeds"):
        create_app(ProxySettings(upstream="http://text-only.invalid/v1", method="icae"), backend=smol_backend)


def test_a_method_trained_with_a_decoder_adapter_is_refused_not_misread(smol_tokenizer, monkeypatch):
    """A soft method whose slots need the decoder LoRA it was trained with (icae v2) would be read wrongly by the
    upstream's plain decoder: the proxy refuses it with a 400 naming the adapter, and serves the rest."""
    from adapters.decoders import FakeBackend
    from compressor.base import DecoderAdapter
    from compressor.filters import BM25Filter
    from serving import handler

    class Adapted(BM25Filter):
        def decoder_adapter(self):
            return DecoderAdapter(name="icae-test", lora={"r": 2}, tensors={})

    real = handler.build_method
    monkeypatch.setattr(handler, "build_method", lambda name, counter, decoder, options=None: Adapted(counter)
                        if name == "minilm" else real(name, counter, decoder, options))
    with serve_in_thread(create_app(ProxySettings(method="bm25"), backend=FakeBackend(smol_tokenizer))) as b:
        oa = client(b)

        def chat(method):
            return oa.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                              max_tokens=2, extra_body={"documents": DOCS,
                                                                        "compression": {"method": method}})

        with pytest.raises(openai.BadRequestError) as e:
            chat("minilm")
        assert e.value.body["code"] == "method_unavailable" and "decoder LoRA adapter (icae-test)" in \
            e.value.body["message"]
        assert chat("bm25").model_extra["compression"]["method"] == "bm25"
