"""The app developer's entry points.

* :class:`RAGPipeline`: one call, query + passages -> answer + compression stats.
* :func:`compress_messages`: a wrapper for an existing chat ``create`` function (an OpenAI client's
  ``chat.completions.create``, a transformers text-generation pipeline, ...) that compresses the documents it
  is given and leaves the rest of the call untouched.

Data path: request -> pipeline -> compressor -> prompt builder -> decoder backend -> response.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from compressor.base import (
    Budget,
    CompressedContext,
    CompressedPassage,
    Compressor,
    TokenCounter,
    coerce_passages,
)
from compressor.errors import InputError
from compressor.prompt import PromptBuilder, PromptTemplate, with_marks
from compressor.registry import get_compressor, get_spec

from .decoders import DecoderBackend, GenerationParams, HFBackend, backend_for

__all__ = ["Answer", "RAGPipeline", "compress_messages"]


class Answer(BaseModel):
    """An answer with the numbers that explain it."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    text: str
    method: str
    tokens_in: int
    tokens_out: int
    ratio: float | None
    prompt_tokens: int
    compress_s: float
    ttft_s: float
    e2e_s: float
    context: CompressedContext


class RAGPipeline:
    """Compress passages with one registered method, then answer with one decoder.

    >>> pipe = RAGPipeline(decoder="smollm2-135m-instruct", method="none")   # doctest: +SKIP
    >>> pipe.answer("Who wrote Hamlet?", ["Hamlet is a tragedy by William Shakespeare."]).text  # doctest: +SKIP
    """

    def __init__(
        self,
        decoder: str | DecoderBackend = "smollm2-135m-instruct",
        method: str | Compressor = "none",
        budget: Budget | dict | None = None,
        template: PromptTemplate | None = None,
        params: GenerationParams | None = None,
        **method_options: Any,
    ) -> None:
        self.backend = decoder if isinstance(decoder, DecoderBackend) else HFBackend.load(decoder)
        self.counter = TokenCounter.from_tokenizer(self.backend.tokenizer)
        if isinstance(method, Compressor):
            self.compressor = method
        else:
            get_spec(method)  # unknown names fail before any model loads
            self.compressor = get_compressor(method, counter=self.counter, **method_options)
        self.backend = backend_for(self.backend, self.compressor)  # a decoder LoRA the method was trained with
        self.budget = budget if isinstance(budget, Budget) or budget is None else Budget(**budget)
        self.builder = self.backend.prompt_builder(template)
        self.params = params or GenerationParams()

    def compress(self, query: str, passages: Sequence[Any], budget: Budget | dict | None = None,
                 explain: bool = False) -> CompressedContext:
        """Compress only; ``explain`` adds what was kept and why (``ctx.explanation``)."""
        return self.compressor.compress(query, passages, budget if budget is not None else self.budget, explain=explain)

    def answer(self, query: str, passages: Sequence[Any], budget: Budget | dict | None = None) -> Answer:
        return self.answer_batch([(query, passages)], budget)[0]

    def chat(self, messages: Sequence[dict[str, Any]], documents: Sequence[Any],
             budget: Budget | dict | None = None) -> Answer:
        """A chat request as ``ragpress serve`` answers it: ``documents`` compressed against the last user
        message and put before it as a ``Documents:`` block (kept text, or a soft method's slots where the text
        would be), the decoder's own chat template, this pipeline's generation parameters. Soft methods need a
        decoder that takes embeddings (transformers, vLLM)."""
        msgs = [dict(m) for m in messages]
        users = [i for i, m in enumerate(msgs) if m.get("role") == "user"]
        if not users or not isinstance(msgs[users[-1]].get("content"), str):
            raise InputError("chat needs a last user message with string content (the question)")
        question = msgs[users[-1]]["content"]
        ctx = self.compress(question, documents, budget)
        shown, rows = with_marks(ctx)
        if shown.passages:
            msgs[users[-1]]["content"] = with_documents(shown.passages, question)
        g = self.backend.generate([PromptBuilder(self.backend.tokenizer, PromptTemplate(style="chat")).chat(msgs, rows)],
                                  self.params)[0]
        return Answer(text=g.text.strip(), method=ctx.method, tokens_in=ctx.tokens_in, tokens_out=ctx.tokens_out,
                      ratio=ctx.ratio, prompt_tokens=g.prompt_tokens, compress_s=ctx.compress_s, ttft_s=g.ttft_s,
                      e2e_s=g.e2e_s + ctx.compress_s, context=ctx)

    def answer_batch(self, items: Sequence[tuple[str, Sequence[Any]]], budget: Budget | dict | None = None) -> list[Answer]:
        """Compress each item, then decode all prompts in one batch."""
        ctxs = [self.compress(q, p, budget) for q, p in items]
        prompts = [self.builder.build(c) for c in ctxs]
        gens = self.backend.generate(prompts, self.params)
        return [
            Answer(text=g.text.strip(), method=c.method, tokens_in=c.tokens_in, tokens_out=c.tokens_out,
                   ratio=c.ratio, prompt_tokens=g.prompt_tokens, compress_s=c.compress_s, ttft_s=g.ttft_s,
                   e2e_s=g.e2e_s + c.compress_s, context=c)
            for c, g in zip(ctxs, gens)
        ]


def documents_block(passages: Sequence[CompressedPassage]) -> str:
    """The ``Documents:`` block inserted before the question (shared with the proxy so the two agree)."""
    lines = []
    for i, p in enumerate(passages, 1):
        lines.append(f"[{i}] {p.title}: {p.text}" if p.title else f"[{i}] {p.text}")
    return "Documents:\n" + "\n".join(lines)


def with_documents(passages: Sequence[CompressedPassage], question: str) -> str:
    """A user message with its documents block before the question (the proxy's body documents, too)."""
    return f"{documents_block(passages)}\n\nQuestion: {question}"


def compress_messages(
    create: Callable[..., Any], compressor: Compressor, budget: Budget | dict | None = None
) -> Callable[..., Any]:
    """Wrap a chat ``create(messages=..., **kw)`` function: it gains a ``documents=`` keyword.

    The documents are compressed against the last user message (the question) and prepended to it as a
    ``Documents:`` block; the system prompt, earlier turns, the question itself and every other keyword go
    through unchanged. Text methods only (a remote chat API takes text). The compression stats of the last
    call are kept on ``wrapped.last_context``.
    """
    if compressor.kind != "text":
        raise InputError(f"compress_messages needs a text method; {compressor.name!r} produces soft prompts")

    @functools.wraps(create)
    def wrapped(*args: Any, documents: Sequence[Any] | None = None, **kwargs: Any) -> Any:
        if documents is None:
            return create(*args, **kwargs)
        positional = "messages" not in kwargs and bool(args)
        if "messages" in kwargs:
            messages = kwargs["messages"]
        elif args:
            messages, args = args[0], args[1:]
        else:
            raise InputError("the wrapped call got no messages; pass messages=[...]")
        messages = [dict(m) for m in messages]
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        if not users or not isinstance(messages[users[-1]].get("content"), str):
            raise InputError("documents= needs a last user message with string content (the question)")
        last = users[-1]
        ctx = compressor.compress(messages[last]["content"], coerce_passages(documents), budget)
        wrapped.last_context = ctx
        if ctx.passages:
            messages[last]["content"] = with_documents(ctx.passages, messages[last]["content"])
        if positional:  # keep the caller's convention: a transformers pipeline takes messages positionally
            return create(messages, *args, **kwargs)
        kwargs["messages"] = messages
        return create(*args, **kwargs)

    wrapped.last_context = None
    return wrapped
