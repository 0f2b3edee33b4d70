"""Configuration of the ``longllmlingua`` peer (no torch or llmlingua import here).

The question-aware settings of the LongLLMLingua paper's RAG setup are fixed, not options: the question
conditions both the coarse (per-passage) ranking and the fine (per-token) pass (``rank_method=
"longllmlingua"``, ``condition_in_question="after_condition"``, ``condition_compare=True``), and passages
keep their input order (``reorder_context="original"``). What remains tunable is below.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["LongLLMLinguaConfig", "FIXED_SETTINGS"]

# Passed verbatim to llmlingua's PromptCompressor.compress_prompt on every call.
FIXED_SETTINGS = {
    "rank_method": "longllmlingua",
    "condition_in_question": "after_condition",
    "condition_compare": True,
    "reorder_context": "original",
    "use_context_level_filter": True,
    "use_token_level_filter": True,
    "use_sentence_level_filter": False,
    "keep_split": False,
    "concate_question": False,  # we want the compressed passages only; the prompt builder adds the question
    "add_instruction": False,
}


class LongLLMLinguaConfig(BaseModel):
    """Options of the LongLLMLingua peer. The defaults are the paper's RAG settings with ragpress' default
    proxy LM as the scorer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scorer: str = Field(default="smollm2-135m-instruct",
                        description="Scorer causal LM: a named model (compressor.models) or a local HF folder.")
    dtype: Literal["float32", "bfloat16"] = Field(
        default="float32", description="Scorer dtype. float32 is llmlingua's own CPU default; bfloat16 also "
        "works (same evidence recall on 3 HotpotQA questions, no faster on 2 busy cores) but rounds the "
        "per-token losses its thresholds are taken over.")
    default_ratio: float = Field(default=5.0, ge=1.0, le=1000.0, description="Ratio used when no budget is given.")
    dynamic_context_compression_ratio: float = Field(
        default=0.3, ge=0.0, le=1.0,
        description="Spread of per-passage token keep rates by coarse rank (the paper's dynamic ratio, 0.3).")
    context_budget_extra: int = Field(
        default=100, ge=0, le=100_000,
        description="Tokens above the target the coarse filter may keep (llmlingua's context_budget='+N').")
    title_in_context: bool = Field(
        default=True, description="Show each passage's title to the scorer as a first line (like the sentence "
        "filters' title_in_score); title tokens are never output, the prompt builder prints titles anyway.")
    iterative_size: int = Field(default=200, ge=16, le=4096, description="Tokens per fine-pass window.")
