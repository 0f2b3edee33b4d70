"""Query-aware sentence filters: split passages into sentences, score each, keep the best within a token
budget (counted in the decoder's tokenizer, never exceeded), and return them in their original order.

Registered here: ``bm25`` (lexical BM25 of each sentence against the question) and ``minilm`` (cosine
similarity of MiniLM-L6 sentence embeddings to the question's). They are the cheap baselines the trained
attention probe (``sentinel``) has to beat.
"""

from .base import SentenceFilter, SentenceFilterConfig, passage_links, select_sentences, select_within_budget
from .bm25 import BM25Filter
from .minilm import MiniLMFilter

__all__ = ["SentenceFilter", "SentenceFilterConfig", "select_sentences", "select_within_budget", "passage_links", "BM25Filter",
           "MiniLMFilter"]
