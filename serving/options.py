"""Pydantic models as command-line options: the field is the flag, its type, its help and its default, so a
config gains an option by gaining a field, and the model's validation stays the only check."""

from __future__ import annotations

import argparse
import typing
from typing import Any

from pydantic import BaseModel

__all__ = ["from_args", "model_options"]


def model_options(p: argparse.ArgumentParser, model: type[BaseModel], exclude: set[str] = frozenset(),
                   rename: dict[str, str] | None = None) -> None:
    """One ``--field-name`` option per field of ``model`` (``rename`` maps a field to another flag), typed and
    described by the field; unset options stay out of the namespace, so the model's own default applies."""
    for name, f in model.model_fields.items():
        if name in exclude:
            continue
        ann, kw = f.annotation, {"default": argparse.SUPPRESS, "dest": name}
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        if typing.get_origin(ann) is typing.Literal:
            kw["choices"] = list(typing.get_args(ann))
        elif ann is bool or args == [bool]:
            kw["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(ann) is list:
            kw.update(nargs="+", type=args[0])
        else:
            kw["type"] = args[0] if args and typing.get_origin(ann) is not None else ann
        default = f.default_factory() if f.default_factory is not None else f.default
        desc = f"{f.description or ''} (default: {default})".replace("%", "%%")
        p.add_argument((rename or {}).get(name, "--" + name.replace("_", "-")), help=desc, **kw)


def from_args(model: type[BaseModel], args: argparse.Namespace, **fixed: Any) -> Any:
    """``model`` built from the options :func:`model_options` added (those given) and ``fixed`` values."""
    given = {k: v for k, v in vars(args).items() if k in model.model_fields and k not in fixed}
    return model(**given, **fixed)
