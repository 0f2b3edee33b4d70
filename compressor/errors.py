"""Exceptions raised by ragpress.

Every error carries a message that names the bad field or value and says how to fix it.
The CLI and the proxy turn them into user-facing errors once, at the edge.

    RagpressError
    ├── ConfigError              a config value is out of range or of the wrong kind
    ├── InputError               a query, passage or budget given to compress()/generate() is unusable
    │   └── BudgetError              a strict budget the method cannot get under
    ├── UnknownNameError         a registry lookup failed (lists the registered names)
    ├── ModelNotAvailableError   a named model's package is missing (names the pip install to run)
    ├── ArtifactError            a trained artifact is corrupt, from the future, or has pickles
    │   └── BaseModelMismatchError   an artifact was trained on another base model / embedder
    ├── MissingExtraError        an optional dependency is not installed (names the extra)
    └── BackendError             a decoder backend failed (upstream down, bad response)
"""

from __future__ import annotations

__all__ = [
    "RagpressError",
    "ConfigError",
    "InputError",
    "BudgetError",
    "UnknownNameError",
    "ModelNotAvailableError",
    "ArtifactError",
    "BaseModelMismatchError",
    "MissingExtraError",
    "BackendError",
]


class RagpressError(Exception):
    """Base class of every ragpress error."""


class ConfigError(RagpressError, ValueError):
    """A configuration value is invalid."""


class InputError(RagpressError, ValueError):
    """Input given to a compressor or pipeline is unusable."""


class BudgetError(InputError):
    """A strict budget (``Budget.strict``) is below the least the method keeps; the message names the ratio it
    can reach."""


class UnknownNameError(RagpressError, KeyError):
    """A name is not in a registry."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else ""


class ModelNotAvailableError(RagpressError, RuntimeError):
    """A named default model cannot be provisioned."""


class ArtifactError(RagpressError, ValueError):
    """A trained artifact folder cannot be loaded."""


class BaseModelMismatchError(ArtifactError):
    """An artifact is being loaded against a different model than the one it was trained on."""


class MissingExtraError(RagpressError, ImportError):
    """An optional dependency is missing."""


class BackendError(RagpressError, RuntimeError):
    """A decoder backend failed."""


def require_extra(module: str, extra: str) -> None:
    """Raise :class:`MissingExtraError` naming the install command if ``module`` cannot be imported."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise MissingExtraError(
            f"this feature needs the optional package {module!r}; install it with "
            f"`pip install 'ragpress[{extra}]'`"
        )
