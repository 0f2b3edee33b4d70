from __future__ import annotations

import pytest

from compressor import (
    ConfigError,
    UnknownNameError,
    available_compressors,
    get_compressor,
    register_compressor,
)
from compressor.reference import FullContext


def test_builtins_registered():
    names = available_compressors()
    assert {"none", "no_context", "oracle"} <= set(names)


def test_unknown_name_lists_registered(counter):
    with pytest.raises(UnknownNameError) as e:
        get_compressor("nope", counter=counter)
    assert "nope" in str(e.value) and "none" in str(e.value) and "oracle" in str(e.value)


@pytest.mark.parametrize("bad", ["", "Bad", "1abc", "has-dash", "x" * 40, None])
def test_bad_names_rejected(bad):
    with pytest.raises(ConfigError):
        register_compressor(bad, lambda counter: FullContext(counter), kind="text", description="x")


def test_duplicate_rejected():
    with pytest.raises(ConfigError, match="already registered"):
        register_compressor("none", lambda counter: FullContext(counter), kind="text", description="x")


def test_bad_kind_rejected():
    with pytest.raises(ConfigError, match="kind"):
        register_compressor("brand_new_kind", lambda counter: FullContext(counter), kind="weird", description="x")


def test_reference_methods_take_no_options(counter):
    with pytest.raises(Exception, match="takes no options"):
        get_compressor("none", counter=counter, ratio=3)
