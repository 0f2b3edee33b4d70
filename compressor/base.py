"""The one contract every compressor family implements.

``compress(query, passages, budget) -> CompressedContext``

A :class:`CompressedContext` holds, per kept passage, either plain text (text methods: the kept sentences
in their original order, with their character spans in the original passage) or soft-prompt rows
(``embeds``: a ``[n, hidden]`` tensor in the decoder's input-embedding space), plus token counts measured
in the *decoder's* tokenizer, the achieved ratio and the compression time. Formatting for people lives in
the CLI and the benchmark, never here.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from .errors import BudgetError, ConfigError, InputError
from .explain import Explanation, explain_from_output

__all__ = [
    "Kept",
    "StopReason",
    "Passage",
    "Budget",
    "CompressedPassage",
    "CompressedContext",
    "CompressRequest",
    "Compressor",
    "DecoderAdapter",
    "IndexReport",
    "TokenCounter",
    "coerce_passages",
]

StopReason = Literal["budget", "min_score", "threshold", "input", "granularity", "passed_through"]
Span = tuple[int, int]


class Passage(BaseModel):
    """One retrieved passage. ``evidence`` marks gold character spans when the data labels them
    (HotpotQA supporting facts, the gold passage under distractors); compressors other than ``oracle``
    never read it, it only feeds evidence recall."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str = Field(description="Passage body text.")
    title: str | None = Field(default=None, description="Optional title, shown as text by every method.")
    id: str | None = Field(default=None, description="Optional caller-side id, carried through.")
    evidence: tuple[Span, ...] | None = Field(default=None, description="Gold [start, end) char spans.")

    @field_validator("text")
    @classmethod
    def _text_not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("passage text is empty or whitespace; drop it before compressing or give it text")
        return v

    @model_validator(mode="after")
    def _evidence_in_range(self) -> Passage:
        for s, e in self.evidence or ():
            if not (0 <= s < e <= len(self.text)):
                raise ValueError(f"evidence span {(s, e)} is outside the passage text (length {len(self.text)})")
        return self


class Budget(BaseModel):
    """How much context to keep. Give ``ratio`` (tokens in / tokens out, >= 1) or ``target_tokens``, or neither
    (the method's default). A budget at or above the input size is a documented no-op: everything is kept.
    ``threshold`` (score-based filters only) keeps every sentence scoring at least that value, capped by the
    token budget if one is also given (a filter with ``complete_links`` may add a named passage's best sentence
    below it).

    The contract every method keeps: ``ratio`` and ``target_tokens`` are *targets*. A method that cannot land
    on one rounds to its granularity (a sentence filter keeps at least its best sentence; a soft method gives
    every segment at least one slot; a passage no shorter than its slots passes as text) and the result says
    so (:attr:`CompressedContext.stopped_by` ``granularity`` / ``passed_through``, next to the reached
    :attr:`~CompressedContext.ratio` and the :attr:`~CompressedContext.asked_ratio`). With ``strict`` the
    target is a hard cap: a method whose least output is over it raises :class:`~compressor.errors.BudgetError`
    naming the ratio it can reach, and never returns more than the cap."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ratio: float | None = Field(default=None, ge=1.0, le=1000.0, description="Compression ratio, 1..1000.")
    target_tokens: int | None = Field(default=None, ge=1, description="Maximum context tokens to keep.")
    threshold: float | None = Field(default=None, description="Score threshold for sentence filters.")
    early_stop: bool | None = Field(
        default=None, description="Sentence filters with a min_score (the shipped sentinel's 1.5): stop below it, "
        "keeping fewer tokens than the budget (what 135M-270M decoders answer best from). None: the method's "
        "default, which is to fill the budget.")
    strict: bool = Field(
        default=False, description="Make ratio / target_tokens a hard cap: refuse (BudgetError) when the method "
        "cannot get under it, instead of rounding to its granularity and saying so.")

    @model_validator(mode="after")
    def _one_of(self) -> Budget:
        if self.ratio is not None and self.target_tokens is not None:
            raise ValueError("give either ratio or target_tokens, not both")
        return self

    def max_tokens(self, tokens_in: int) -> int | None:
        """Token allowance for an input of ``tokens_in`` tokens (None: no token cap)."""
        if self.target_tokens is not None:
            return min(self.target_tokens, tokens_in)
        if self.ratio is not None:
            return max(1, int(tokens_in / self.ratio))
        return None

    def asked_ratio(self, tokens_in: int) -> float | None:
        """The ratio this budget asks of an input of ``tokens_in`` tokens (None: the method's default)."""
        if self.ratio is not None:
            return self.ratio
        if self.target_tokens is not None and tokens_in:
            return tokens_in / min(self.target_tokens, tokens_in)
        return None


class CompressedPassage(BaseModel):
    """What is left of one input passage."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    index: int = Field(description="Position of the passage in the input list.")
    title: str | None = None
    text: str | None = Field(default=None, description="Kept text (text methods).")
    spans: list[Span] = Field(default_factory=list, description="Kept [start, end) char spans in the passage.")
    sentence_ids: list[int] = Field(default_factory=list, description="Indices of kept sentences.")
    scores: list[float] = Field(default_factory=list, description="Scores of the kept sentences.")
    embeds: Any | None = Field(default=None, description="Soft rows, torch.Tensor [n, hidden] (soft methods).")
    tokens_in: int = 0
    tokens_out: int = 0


class CompressedContext(BaseModel):
    """The result of ``compress``: per-passage text or soft rows, with numeric stats."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    method: str
    kind: Literal["text", "soft"]
    query: str
    passages: list[CompressedPassage]
    n_input_passages: int
    tokens_in: int = Field(description="Context tokens before compression, in the decoder's tokenizer.")
    tokens_out: int = Field(description="Context tokens (text) or soft rows after compression.")
    compress_s: float = 0.0
    asked_ratio: float | None = Field(default=None, description="The ratio the budget asked for (target_tokens "
                                      "as tokens_in / target_tokens); None: the method's default.")
    stopped_by: StopReason | None = Field(
        default=None, description="Why the method kept what it kept, and so why the reached ratio differs from the "
        "asked one: 'budget' (the next sentence, or nothing more, fit), 'min_score' (early stop below the "
        "method's min_score), 'threshold' (the budget's threshold), 'input' (the whole input fit), "
        "'granularity' (the least the method keeps, one sentence or one slot per segment, is over the target), "
        "'passed_through' (passages no longer than their compressed form went as text, or the method does not "
        "compress). None: the method keeps no budget (no_context).")
    duplicates: int = Field(default=0, description="Input passages dropped as repeats of an earlier one (same "
                            "title and text up to whitespace): scored, counted in tokens_in and kept once.")
    duplicate_sentences: int = Field(default=0, description="Sentences dropped as repeats of one in an earlier "
                                     "passage (overlapping retriever chunks).")
    explanation: Explanation | None = Field(default=None, description="Per passage and sentence: what was kept "
                                            "and why (``compress(..., explain=True)`` or :meth:`explain`).")
    _explainer: Callable[[CompressedContext], Explanation] | None = PrivateAttr(default=None)

    def explain(self) -> Explanation:
        """What was kept and why, per passage and sentence (:mod:`compressor.explain`); computed on the first
        call and kept in :attr:`explanation`."""
        if self.explanation is None:
            if self._explainer is None:
                raise ConfigError("this result was not made by Compressor.compress, so it cannot explain itself")
            self.explanation = self._explainer(self)
        return self.explanation

    @property
    def ratio(self) -> float | None:
        """Measured tokens_in / tokens_out; None when nothing is kept (no context)."""
        return self.tokens_in / self.tokens_out if self.tokens_out else None

    @property
    def text(self) -> str:
        """Kept text of all passages joined by blank lines (text methods)."""
        return "\n\n".join(p.text for p in self.passages if p.text)

    def stats(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "ratio": self.ratio,
            "asked_ratio": self.asked_ratio,
            "compress_s": self.compress_s,
            "stopped_by": self.stopped_by,
            "duplicates": self.duplicates,
        }


@dataclass
class Kept:
    """What :meth:`Compressor._compress` returns when it has more to say than the kept passages."""

    passages: list[CompressedPassage]
    stopped_by: StopReason | None = None
    duplicates: int = 0
    duplicate_sentences: int = 0
    explain: Callable[[CompressedContext], Explanation] | None = None  # lazy; None: read off the output


class IndexReport(BaseModel):
    """What :meth:`Compressor.index` did: per-passage work computed ahead of time into the method's cache."""

    model_config = ConfigDict(extra="forbid")

    method: str
    passages: int = Field(description="Passages given.")
    computed: int = Field(description="Passages whose work was computed now and stored.")
    cached: int = Field(description="Passages already in the cache (nothing computed).")
    duplicates: int = Field(default=0, description="Repeats of a passage given earlier in the call (done once).")
    skipped: int = Field(default=0, description="Passages with nothing to store (no sentences).")
    seconds: float


class TokenCounter:
    """Counts tokens in the decoder's tokenizer (no special tokens). Wraps a HF tokenizer or any callable
    ``str -> list[int]`` (``encode_many``: an optional batch form). Counts are memoised per text (at most
    ``memo`` texts, then the memo starts over): a served compressor sees the same passages and sentences again
    with every question that retrieves them."""

    def __init__(self, encode: Callable[[str], Sequence[int]], name: str = "custom",
                 encode_many: Callable[[list[str]], Sequence[Sequence[int]]] | None = None, memo: int = 65536) -> None:
        self._encode = encode
        self._encode_many = encode_many
        self.name = name
        self._memo: dict[str, int] = {}
        self._memo_size = memo

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> TokenCounter:
        return cls(
            lambda s: tokenizer(s, add_special_tokens=False)["input_ids"],
            name=getattr(tokenizer, "name_or_path", type(tokenizer).__name__),
            encode_many=lambda texts: tokenizer(texts, add_special_tokens=False)["input_ids"],
        )

    def encode(self, text: str) -> list[int]:
        return list(self._encode(text))

    def _remember(self, counts: dict[str, int]) -> None:
        if len(self._memo) + len(counts) > self._memo_size:
            self._memo = {}
        self._memo.update(counts)

    def count(self, text: str) -> int:
        if not text:
            return 0
        n = self._memo.get(text)
        if n is None:
            n = len(self._encode(text))
            self._remember({text: n})
        return n

    def count_many(self, texts: Sequence[str]) -> list[int]:
        """:meth:`count` of each text; the ones not memoised are encoded in one batch where the tokenizer has one."""
        known = {t: self._memo[t] for t in texts if t and t in self._memo}
        missing = [t for t in dict.fromkeys(texts) if t and t not in known]
        if missing:
            ids = self._encode_many(missing) if self._encode_many else [self._encode(t) for t in missing]
            fresh = {t: len(i) for t, i in zip(missing, ids, strict=True)}
            self._remember(fresh)
            known.update(fresh)
        return [known[t] if t else 0 for t in texts]


def coerce_passages(passages: Any) -> list[Passage]:
    """Accept strings, dicts or :class:`Passage` objects; raise :class:`InputError` naming the bad item."""
    if isinstance(passages, (str, bytes)) or not isinstance(passages, Sequence):
        raise InputError("passages must be a list of strings or {text, title, id} objects, not a single "
                         f"{type(passages).__name__}; wrap it in a list")
    if len(passages) == 0:
        raise InputError("passages is empty; pass at least one passage, or use method 'no_context'")
    out: list[Passage] = []
    for i, p in enumerate(passages):
        try:
            if isinstance(p, Passage):
                out.append(p)
            elif isinstance(p, str):
                out.append(Passage(text=p))
            elif isinstance(p, dict):
                out.append(Passage(**p))
            else:
                raise InputError(f"passages[{i}] is a {type(p).__name__}; give a string or a {{text, title}} dict")
        except InputError:
            raise
        except Exception as e:  # pydantic ValidationError: re-raise naming the item
            raise InputError(f"passages[{i}] is invalid: {e}") from None
    return out


class CompressRequest(BaseModel):
    """One question's context for :meth:`Compressor.compress_batch`."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    query: Any = Field(description="The question (checked as compress checks it).")
    passages: Any = Field(description="Strings, {text, title, id} dicts or Passage objects.")
    budget: Budget | dict | None = None


def _checked(query: Any, passages: Any, budget: Budget | dict | None) -> tuple[str, list[Passage], Budget]:
    """The validated ``(query, passages, budget)`` of one compression; :class:`InputError` names what is wrong."""
    query = _check_query(query)
    plist = coerce_passages(passages)
    if budget is None:
        budget = Budget()
    elif isinstance(budget, dict):
        try:
            budget = Budget(**budget)
        except Exception as e:
            raise InputError(f"budget is invalid: {e}") from None
    return query, plist, budget


def _check_query(query: Any) -> str:
    if not isinstance(query, str):
        raise InputError(f"query must be a string, got {type(query).__name__}")
    if not query.strip():
        raise InputError("query is empty; pass the user's question")
    return query


@dataclass(frozen=True)
class DecoderAdapter:
    """A decoder-side LoRA adapter a soft method was trained with: ``name`` (artifact id, for logs and
    caching), ``lora`` (``peft.LoraConfig`` keyword arguments), ``tensors`` (its peft state dict, fp32) and
    tensors were trained on the compressor's base model, which is the decoder it is built for."""

    name: str
    lora: dict[str, Any]
    tensors: dict[str, Any]


class Compressor(ABC):
    """Base class of every compressor family.

    Subclasses set ``name`` and ``kind`` and implement :meth:`_compress`. The public :meth:`compress`
    validates input, times the call and fills in the totals.
    """

    name: ClassVar[str] = "base"
    kind: ClassVar[Literal["text", "soft"]] = "text"

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter

    def compress(self, query: str, passages: Any, budget: Budget | dict | None = None,
                 explain: bool = False) -> CompressedContext:
        """Compress ``passages`` for ``query`` within ``budget``. With ``explain`` the result carries, per passage
        and sentence, what was kept and why (:attr:`CompressedContext.explanation`; computed after the timing,
        so ``compress_s`` is the same either way)."""
        query, plist, budget = _checked(query, passages, budget)
        t0 = time.perf_counter()
        kept = self._compress(query, plist, budget)
        return self._result(query, plist, budget, kept, time.perf_counter() - t0, explain)

    def compress_batch(self, requests: Sequence[CompressRequest | tuple[str, Any, Budget | dict | None]],
                       explain: bool = False) -> list[CompressedContext]:
        """Compress several questions' contexts in one call: the same results as :meth:`compress` on each, in
        order, computed together where the method gains by it (a filter's sentence embeddings in one batch,
        icae's passages encoded together). A request is a :class:`CompressRequest` or ``(query, passages,
        budget)``; every one is checked before any work. ``compress_s`` of each result is the batch's time
        divided by the number of requests (what one costs when they arrive together)."""
        items = []
        for i, r in enumerate(requests):
            try:
                if isinstance(r, CompressRequest):
                    items.append(_checked(r.query, r.passages, r.budget))
                elif isinstance(r, tuple) and len(r) == 3:
                    items.append(_checked(*r))
                else:
                    raise InputError(f"is a {type(r).__name__}; give a CompressRequest or a (query, passages, budget) "
                                     "tuple")
            except InputError as e:
                raise InputError(f"requests[{i}] {e}") from None
        if not items:
            return []
        t0 = time.perf_counter()
        kept = self._compress_batch(items) if len(items) > 1 else [self._compress(*items[0])]
        share = (time.perf_counter() - t0) / len(items)
        return [self._result(q, pl, b, k, share, explain) for (q, pl, b), k in zip(items, kept, strict=True)]

    def _compress_batch(self, items: list[tuple[str, list[Passage], Budget]]) -> list[list[CompressedPassage] | Kept]:
        """The kept passages of each ``(query, passages, budget)``; families that gain by batching override it."""
        return [self._compress(q, p, b) for q, p, b in items]

    def _result(self, query: str, plist: list[Passage], budget: Budget, kept: list[CompressedPassage] | Kept,
                dt: float, explain: bool) -> CompressedContext:
        if not isinstance(kept, Kept):
            kept = Kept(kept)
        tokens_in = sum(self.counter.count(p.text) for p in plist)
        tokens_out = sum(p.tokens_out for p in kept.passages)
        stopped_by = kept.stopped_by
        cap = budget.max_tokens(tokens_in)
        if cap is not None and tokens_out > cap:  # the contract: a target rounds, a strict budget refuses
            if stopped_by not in ("granularity", "passed_through"):
                stopped_by = "granularity"
            self.check_strict(budget, tokens_in, tokens_out, stopped_by)
        ctx = CompressedContext(
            method=self.name,
            kind=self.kind,
            query=query,
            passages=kept.passages,
            n_input_passages=len(plist),
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            compress_s=dt,
            asked_ratio=budget.asked_ratio(tokens_in),
            stopped_by=stopped_by,
            duplicates=kept.duplicates,
            duplicate_sentences=kept.duplicate_sentences,
        )
        ctx._explainer = kept.explain or (lambda c: explain_from_output(c, plist, self.counter))
        if explain:
            ctx.explain()
        return ctx

    @abstractmethod
    def _compress(self, query: str, passages: list[Passage], budget: Budget) -> list[CompressedPassage] | Kept:
        """Return the kept passages in input order (or a :class:`Kept` saying also why and what was merged)."""

    def check_strict(self, budget: Budget, tokens_in: int, least: int, why: str) -> None:
        """Raise :class:`BudgetError` when ``budget`` is strict and ``least``, the fewest tokens (or rows) this
        method can keep of ``tokens_in``, is over its cap. Methods call it before costly work; :meth:`compress`
        calls it on every result."""
        cap = budget.max_tokens(tokens_in)
        if not budget.strict or cap is None or least <= cap:
            return
        asked = f"ratio {budget.ratio:g}" if budget.ratio is not None else f"target_tokens {budget.target_tokens}"
        reach = f"ratio <= {tokens_in / least:.2f} or " if least else ""
        raise BudgetError(
            f"{self.name} cannot keep these {tokens_in} tokens within the strict budget of {cap} ({asked}): the least "
            f"it keeps is {least} ({why.replace('_', ' ')}); ask for {reach}target_tokens >= {least}, or drop strict "
            "to let it round to its granularity and report the ratio it reached")

    def index(self, passages: Any) -> IndexReport:
        """Index time: compute the per-passage work of a method that caches it (ICAE memory slots, sentinel
        sentence embeddings) for a corpus, ahead of any question, into the method's ``cache_dir``. A later
        :meth:`compress` over these passages reads it instead of computing it. Passages already cached are not
        computed again, so indexing a growing corpus repeatedly costs only its new passages."""
        plist = coerce_passages(passages)
        t0 = time.perf_counter()
        unique = list({(p.title, p.text): p for p in plist}.values())  # a corpus often repeats passages
        computed, cached = self._index(unique)
        return IndexReport(method=self.name, passages=len(plist), computed=computed, cached=cached,
                           duplicates=len(plist) - len(unique), skipped=len(unique) - computed - cached,
                           seconds=time.perf_counter() - t0)

    def attach_index(self, index: Any) -> None:
        """Read per-document vectors from a retrieval index built ahead of time (:class:`~compressor.retrieval.
        DocumentIndex`), as xRAG does; a method that reads none has nothing to attach."""
        return None

    def decoder_adapter(self) -> DecoderAdapter | None:
        """The LoRA adapter the decoder must apply to read this method's output (PISCO / COCOM-style soft
        compressors trained with a decoder adapter), or None: the plain decoder reads it."""
        return None

    def caches(self) -> list[Any]:
        """The per-passage caches (:class:`~compressor.cache.TensorCache`) this instance reads and fills, for
        hit counts; empty without a ``cache_dir`` or for methods that keep none."""
        return []

    def run_stats(self) -> dict[str, Any]:
        """What this instance did since it was built, for a run's summary: cache hits, passages encoded, whether
        its weights are trained. Empty for methods with nothing to report; families override it."""
        return {}

    def _index(self, passages: list[Passage]) -> tuple[int, int]:
        """Store each passage's work in the cache: (passages computed now, passages already cached)."""
        raise ConfigError(f"method {self.name!r} keeps no per-passage cache, so there is nothing to index; "
                          "index with a method that has one (sentinel, icae)")
