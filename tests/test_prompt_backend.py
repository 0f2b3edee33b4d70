from __future__ import annotations

import pytest
import torch

from adapters.decoders import GenerationParams, HFBackend
from compressor import CompressedContext, CompressedPassage, PromptBuilder, PromptTemplate
from compressor.prompt import embed_prompt


def _soft_ctx(hidden: int, n_rows=(3, 2)):
    torch.manual_seed(1)
    ps = [CompressedPassage(index=i, title=f"T{i}", embeds=torch.randn(n, hidden), tokens_in=10, tokens_out=n)
          for i, n in enumerate(n_rows)]
    return CompressedContext(method="x", kind="soft", query="Who?", passages=ps, n_input_passages=2,
                             tokens_in=20, tokens_out=sum(n_rows))


def test_chat_and_plain_styles(smol_tokenizer):
    chat = PromptBuilder(smol_tokenizer)
    assert chat.style == "chat"
    text = smol_tokenizer.decode(chat.build_text("Who wrote Hamlet?", "[1] Hamlet: by Shakespeare.").token_ids)
    assert "<|im_start|>assistant" in text and "Who wrote Hamlet?" in text and "Dijon" in text
    plain = PromptBuilder(smol_tokenizer, PromptTemplate(style="plain"))
    ids = plain.build_text("Who?", None).token_ids
    assert ids[0] == smol_tokenizer.bos_token_id
    assert smol_tokenizer.decode(ids).rstrip().endswith("Answer:")


def test_soft_rows_spliced_in_place(smol_tokenizer):
    b = PromptBuilder(smol_tokenizer)
    ctx = _soft_ctx(16)
    p = b.build(ctx)
    kinds = ["ids" if isinstance(s, list) else "soft" for s in p.segments]
    assert kinds == ["ids", "soft", "ids", "soft", "ids"]
    assert torch.equal(p.segments[1], ctx.passages[0].embeds) and torch.equal(p.segments[3], ctx.passages[1].embeds)
    assert smol_tokenizer.decode(p.segments[0]).endswith("[1] T0: ")
    assert smol_tokenizer.decode(p.segments[2]).startswith("\n[2] T1: ")
    assert len(p) == sum(len(s) for s in p.segments[::2]) + 5


def test_embed_prompt_uses_embedding_table(tiny_model, smol_tokenizer):
    b = PromptBuilder(smol_tokenizer)
    p = b.build_text("Who?", "[1] doc")
    e = embed_prompt(tiny_model, p)
    assert torch.equal(e, tiny_model.get_input_embeddings()(torch.tensor(p.token_ids)))


def test_embeds_generate_exactly_as_ids(tiny_backend, smol_tokenizer):
    from compressor.prompt import Prompt

    b = PromptBuilder(smol_tokenizer)
    p = b.build_text("Who wrote Hamlet?", "[1] Hamlet: a play by William Shakespeare.")
    as_embeds = Prompt(segments=[embed_prompt(tiny_backend.model, p)], stop=p.stop)
    params = GenerationParams(max_new_tokens=12, stop=[])
    a = tiny_backend.generate([p], params)[0]
    c = tiny_backend.generate([as_embeds], params)[0]
    assert a.token_ids == c.token_ids and len(a.token_ids) > 0


def test_batch_left_padding_matches_single(tiny_backend, smol_tokenizer):
    b = PromptBuilder(smol_tokenizer)
    prompts = [b.build_text("Short?", None), b.build_text("A much longer question about many things?", "[1] x y z")]
    params = GenerationParams(max_new_tokens=8, stop=[])
    batch = tiny_backend.generate(prompts, params)
    single = [tiny_backend.generate([p], params)[0] for p in prompts]
    for x, y in zip(batch, single):
        assert x.token_ids == y.token_ids


def test_soft_prompt_batch_matches_single(tiny_backend, smol_tokenizer):
    b = PromptBuilder(smol_tokenizer)
    prompts = [b.build(_soft_ctx(32)), b.build(_soft_ctx(32, (1, 4)))]
    params = GenerationParams(max_new_tokens=6, stop=[])
    batch = tiny_backend.generate(prompts, params)
    single = [tiny_backend.generate([p], params)[0] for p in prompts]
    assert [x.token_ids for x in batch] == [y.token_ids for y in single]


def test_wrong_soft_width_rejected(tiny_backend, smol_tokenizer):
    from compressor import InputError

    p = PromptBuilder(smol_tokenizer).build(_soft_ctx(7))
    with pytest.raises(InputError, match="hidden size"):
        tiny_backend.generate([p])


def test_sampling_is_seeded(tiny_backend, smol_tokenizer):
    p = PromptBuilder(smol_tokenizer).build_text("Who?", None)
    params = GenerationParams(max_new_tokens=10, temperature=1.0, top_p=0.9, seed=7, stop=[])
    a = tiny_backend.generate([p], params)[0].token_ids
    assert a == tiny_backend.generate([p], params)[0].token_ids


def test_stop_strings_and_max_tokens(tiny_backend, smol_tokenizer):
    p = PromptBuilder(smol_tokenizer).build_text("Who?", None)
    g = tiny_backend.generate([p], GenerationParams(max_new_tokens=5, stop=[]))[0]
    assert len(g.token_ids) <= 5 and g.ttft_s <= g.e2e_s
    if g.text:
        stop = g.text[len(g.text) // 2:] or g.text
        g2 = tiny_backend.generate([p], GenerationParams(max_new_tokens=5, stop=[stop]))[0]
        assert stop not in g2.text and g2.finish_reason == "stop"


def test_gemma_style_scaled_embeddings(smol_tokenizer):
    """Gemma scales input embeddings by sqrt(hidden) inside its embedding module; splicing via
    embed_prompt must land in that scale, so embeds and ids generate alike."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    cfg = Gemma3TextConfig(vocab_size=len(smol_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=16,
                           max_position_embeddings=4096)
    model = Gemma3ForCausalLM(cfg).eval()
    be = HFBackend(model, smol_tokenizer, "tiny-gemma")
    from compressor.prompt import Prompt

    p = PromptBuilder(smol_tokenizer, PromptTemplate(style="plain")).build_text("Who?", "[1] some doc text")
    e = embed_prompt(model, p)
    raw = model.get_input_embeddings().weight[torch.tensor(p.token_ids)]
    assert torch.allclose(e, raw * (32 ** 0.5), rtol=1e-3)
    params = GenerationParams(max_new_tokens=6, stop=[])
    assert be.generate([p], params)[0].token_ids == be.generate([Prompt([e])], params)[0].token_ids


@pytest.mark.real_model
def test_real_smollm2_embeds_equal_ids(smol_backend):
    from compressor.prompt import Prompt

    b = smol_backend.prompt_builder()
    p = b.build_text("What is the capital of France?", "[1] Paris: Paris is the capital and largest city of France.")
    e = Prompt(segments=[embed_prompt(smol_backend.model, p)], stop=p.stop)
    params = GenerationParams(max_new_tokens=10)
    a, c = smol_backend.generate([p], params)[0], smol_backend.generate([e], params)[0]
    assert a.token_ids == c.token_ids
    assert "paris" in a.text.lower()
