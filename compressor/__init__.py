"""ragpress compressors: one contract (``compress(query, passages, budget) -> CompressedContext``), a
registry by name, and the families behind it."""

from . import compose as _compose  # noqa: F401  (registers sentinel+icae)
from . import filters as _filters  # noqa: F401  (registers bm25 / minilm)
from . import icae as _icae  # noqa: F401  (registers icae when its trained encoder ships)
from . import longllmlingua as _longllmlingua  # noqa: F401  (registers the outside peer)
from . import reference as _reference  # noqa: F401  (registers none / no_context / oracle)
from . import sentinel as _sentinel  # noqa: F401  (registers sentinel)
from . import xrag as _xrag  # noqa: F401  (registers xrag when its trained bridge ships)
from ._version import __version__  # noqa: F401  (compressor.__version__; families read ._version)
from .base import (
    Budget,
    CompressedContext,
    CompressedPassage,
    Compressor,
    CompressRequest,
    IndexReport,
    Passage,
    TokenCounter,
)
from .errors import (
    ArtifactError,
    BaseModelMismatchError,
    BudgetError,
    ConfigError,
    InputError,
    MissingExtraError,
    ModelNotAvailableError,
    RagpressError,
    UnknownNameError,
)
from .explain import Explanation, PassageExplanation, SentenceExplanation
from .prompt import Prompt, PromptBuilder, PromptTemplate
from .registry import available_compressors, get_compressor, get_spec, register_compressor

__all__ = [
    "ArtifactError",
    "BaseModelMismatchError",
    "Budget",
    "BudgetError",
    "CompressedContext",
    "CompressedPassage",
    "CompressRequest",
    "Compressor",
    "ConfigError",
    "Explanation",
    "IndexReport",
    "InputError",
    "MissingExtraError",
    "ModelNotAvailableError",
    "Passage",
    "PassageExplanation",
    "Prompt",
    "PromptBuilder",
    "PromptTemplate",
    "RagpressError",
    "SentenceExplanation",
    "TokenCounter",
    "UnknownNameError",
    "available_compressors",
    "get_compressor",
    "get_spec",
    "register_compressor",
]
