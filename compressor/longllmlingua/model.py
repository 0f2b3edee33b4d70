"""``longllmlingua``: the outside peer, LongLLMLingua from the ``llmlingua`` package (0.2.2), run offline.

Paper: Jiang et al., 2024, "LongLLMLingua: Accelerating and Enhancing LLMs in Long Context Scenarios via
Prompt Compression" (ACL 2024). A small scorer LM (here ragpress' default proxy, SmolLM2-135M-Instruct,
on the CPU) ranks passages by the perplexity of the question given each passage (coarse filter, keeping
passages up to the target plus ``context_budget_extra`` tokens), then drops tokens whose loss conditioned
on the question (``condition_compare``: the loss without the question minus the loss with it) is least
informative, window by window, keeping more of the better-ranked passages (dynamic ratio).

In/out: a question and ``n`` passages in; per surviving passage, text made of the kept tokens, in input
order. No tensors leave this module.

What ragpress adds around llmlingua (its algorithm is untouched; the offline and transformers-5 adaptations
are listed in :mod:`.compat`):

* **Budget.** ``Budget.max_tokens`` of the context, in the decoder's tokens (the ``TokenCounter``), is
  passed as ``target_token``: the same as llmlingua's ``rate = 1/ratio`` applied to the passages alone
  (llmlingua's own ``rate`` would also scale the question's tokens into the context budget). A budget at or
  above the input is a documented no-op: everything is kept, the scorer does not run.
  With title lines shown to the scorer, llmlingua counts them as context too and their kept tokens are
  not output, so results can land under the budget (5.5x measured at ratio 5 on 5 HotpotQA questions).
* **Hard cap.** LongLLMLingua treats the target as approximate (its coarse filter keeps ``+100`` tokens
  on purpose; its per-window thresholds are quantile estimates) and often lands above it. The ragpress
  contract never exceeds the budget, so the result is trimmed deterministically at LongLLMLingua's own
  granularity, one kept scorer token at a time: the last kept token of the passage LongLLMLingua's coarse
  ranking put lowest, until the decoder count fits. How much was trimmed is reported in
  :meth:`LongLLMLinguaCompressor.run_stats` (``trimmed_tokens``, ``trimmed_calls``, ``peer_tokens_out``).
* **Provenance.** Each kept token is mapped back to the passage and character range it came from (scorer
  tokenizer offsets), so ``spans`` are the real kept character ranges (adjacent ranges merged when only
  whitespace lies between them) and evidence recall is measured as for every text method. ``sentence_ids``
  and ``scores`` stay empty: the method keeps tokens, not sentences, and has no per-passage score to report.
  Titles are read by the scorer as a first line (``title_in_context``, as the filters score with titles)
  but never output: they are carried through uncompressed, as for every ragpress method.

Trade-off: unlike the sentence filters (``bm25``, ``minilm``, ``sentinel``) it keeps fragments of many
sentences, which reads as broken text to a small decoder, and it costs one scorer pass per passage plus two
passes (with and without the question) over the kept passages; unlike ``icae``/``xrag`` it needs no
training and any decoder can read its output.
"""

from __future__ import annotations

import threading
from typing import Any

from ..base import Budget, CompressedPassage, Compressor, Kept, Passage, TokenCounter
from ..errors import InputError, require_extra
from .config import FIXED_SETTINGS, LongLLMLinguaConfig

__all__ = ["LongLLMLinguaCompressor"]

Span = tuple[int, int]


class LongLLMLinguaCompressor(Compressor):
    name = "longllmlingua"
    kind = "text"

    def __init__(self, counter: TokenCounter, config: LongLLMLinguaConfig | None = None) -> None:
        require_extra("llmlingua", "bench")
        super().__init__(counter)
        self.config = config or LongLLMLinguaConfig()
        self._peer: Any = None
        self._lock = threading.Lock()
        self._stats = {"calls": 0, "scored_calls": 0, "trimmed_calls": 0, "trimmed_tokens": 0,
                       "peer_tokens_out": 0, "tokens_out": 0}

    @property
    def peer(self) -> Any:
        """The offline llmlingua ``PromptCompressor`` (loaded on first use)."""
        if self._peer is None:
            from ..models import resolve_model
            from .compat import LocalEncoding, OfflinePromptCompressor

            self._peer = OfflinePromptCompressor(resolve_model(self.config.scorer), self.config.dtype,
                                                 LocalEncoding(self.counter.encode, self.counter.name))
        return self._peer

    def run_stats(self) -> dict[str, Any]:
        """Totals since construction: ``peer_tokens_out`` is what LongLLMLingua itself kept (decoder tokens,
        before the hard cap), ``trimmed_tokens`` what the cap removed, ``trimmed_calls`` how often."""
        return {f"longllmlingua_{k}": v for k, v in self._stats.items()}

    def _compress(self, query: str, passages: list[Passage], budget: Budget) -> Kept:
        if budget.threshold is not None:
            raise InputError("budget.threshold applies to score-based sentence filters; longllmlingua takes "
                             "ratio or target_tokens")
        if budget.ratio is None and budget.target_tokens is None:
            budget = Budget(ratio=self.config.default_ratio)
        counts = [self.counter.count(p.text) for p in passages]
        cap = budget.max_tokens(sum(counts))
        self._stats["calls"] += 1
        if cap is None or cap >= sum(counts):  # documented no-op: the budget holds the whole input
            return Kept([CompressedPassage(index=i, title=p.title, text=p.text, spans=[(0, len(p.text))],
                                           tokens_in=n, tokens_out=n) for i, (p, n) in enumerate(zip(passages, counts))],
                        stopped_by="input")
        settings = dict(FIXED_SETTINGS, iterative_size=self.config.iterative_size,
                        dynamic_context_compression_ratio=self.config.dynamic_context_compression_ratio,
                        context_budget=f"+{self.config.context_budget_extra}")
        with self._lock:  # one llmlingua object, stateful during a call
            _, trace = self.peer.compress_traced([self._scored_text(p) for p in passages], query, cap, **settings)
        bases = self._bases(passages, trace)
        kept = self._tokens_by_passage(passages, trace, bases)
        out = {i: self._passage(passages[i], i, toks, trace, bases[i], counts[i]) for i, toks in kept.items() if toks}
        out = {i: cp for i, cp in out.items() if cp.text}
        peer_total = sum(cp.tokens_out for cp in out.values())
        self._stats["scored_calls"] += 1
        self._stats["peer_tokens_out"] += peer_total
        total, trimmed = peer_total, 0
        # Hard cap: drop the last kept token of the lowest-ranked passage until the decoder count fits.
        rank = {pi: r for r, pi in enumerate(trace.ranking)}
        while total > cap:
            victim = max(out, key=lambda i: (rank.get(i, len(rank)), i))
            kept[victim] = kept[victim][:-1]
            trimmed += 1
            total -= out[victim].tokens_out
            cp = self._passage(passages[victim], victim, kept[victim], trace, bases[victim], counts[victim])
            if cp.text:
                out[victim] = cp
                total += cp.tokens_out
            else:
                del out[victim]
        if trimmed:
            self._stats["trimmed_calls"] += 1
            self._stats["trimmed_tokens"] += trimmed
        self._stats["tokens_out"] += total
        return Kept([out[i] for i in sorted(out)], stopped_by="budget")  # token granularity: always within the cap

    def _scored_text(self, p: Passage) -> str:
        """What the scorer reads for a passage: its text, after a title line when ``title_in_context``."""
        return f"{p.title}\n{p.text}" if self.config.title_in_context and p.title else p.text

    def _bases(self, passages: list[Passage], trace: Any) -> dict[int, int]:
        """Character offset of each coarse-kept passage's text inside the text llmlingua compressed (its
        parts joined by ``"\\n\\n"``, after the question prefix when the fine pass is conditioned on it;
        a title line, if any, lies before the offset)."""
        first = 1 if trace.start else 0
        if len(trace.parts) - first != len(trace.used):
            raise RuntimeError(f"llmlingua compressed {len(trace.parts)} parts for {len(trace.used)} passages")
        bases, pos = {}, 0
        for j, part in enumerate(trace.parts):
            if j >= first:
                pi = trace.used[j - first]
                if part != self._scored_text(passages[pi]):
                    raise RuntimeError(f"llmlingua's part {j} is not passage {pi}'s text")
                bases[pi] = pos + len(part) - len(passages[pi].text)
            pos += len(part) + 2
        return bases

    @staticmethod
    def _tokens_by_passage(passages: list[Passage], trace: Any, bases: dict[int, int]) -> dict[int, list[int]]:
        """Kept scorer-token positions per passage. A token belongs to the passage holding its first
        non-space character; tokens of the question, of title lines and of the ``\\n\\n`` joins belong to none."""
        out: dict[int, list[int]] = {pi: [] for pi in bases}
        for t in trace.kept:
            a, b = trace.offsets[t]
            chunk = trace.text[a:b]
            at = a + len(chunk) - len(chunk.lstrip()) if chunk.strip() else a
            for pi, base in bases.items():
                if base <= at < base + len(passages[pi].text):
                    out[pi].append(t)
                    break
        return out

    def _passage(self, p: Passage, index: int, toks: list[int], trace: Any, base: int,
                 tokens_in: int) -> CompressedPassage:
        """One passage from its kept tokens: decoded text, and the kept character ranges of its text."""
        text = self.peer.tokenizer.decode([trace.ids[t] for t in toks]).strip() if toks else ""
        spans: list[Span] = []
        for t in toks:
            a, b = trace.offsets[t]
            a, b = max(a - base, 0), min(b - base, len(p.text))
            if a >= b:
                continue
            if spans and not p.text[spans[-1][1]:a].strip():
                spans[-1] = (spans[-1][0], max(spans[-1][1], b))
            else:
                spans.append((a, b))
        return CompressedPassage(index=index, title=p.title, text=text, spans=spans,
                                 tokens_in=tokens_in, tokens_out=self.counter.count(text))
