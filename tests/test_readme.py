"""The README is the front door: every command and code block in it runs, or at least parses and names real
options, targets, files and imports; its method table is the registry; its relative links resolve."""

from __future__ import annotations

import ast
import importlib
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
BLOCKS = re.findall(r"^```(\w*)\n(.*?)^```", README, flags=re.M | re.S)
SHELL = [body for lang, body in BLOCKS if lang in ("bash", "sh", "console")]
PYTHON = [body for lang, body in BLOCKS if lang == "python"]


def _shell_lines() -> list[str]:
    """Every shell line, continuations joined, a console block's `$ ` prompt dropped."""
    text = "\n".join(SHELL).replace("\\\n", " ")
    return [ln.strip().removeprefix("$ ") for ln in text.splitlines() if ln.strip()]


def _argv(line: str) -> list[str]:
    argv = shlex.split(line, comments=True)
    while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", argv[0]):  # VAR=value prefixes
        argv.pop(0)
    return argv


RAGPRESS = [ln for ln in _shell_lines() if _argv(ln)[:1] and Path(_argv(ln)[0]).name == "ragpress"]


def test_readme_has_what_these_tests_read():
    assert len(SHELL) >= 2 and len(PYTHON) >= 2 and len(RAGPRESS) >= 3
    first = README.index("```")  # the README starts with the two set-up commands, before any section
    assert first < README.index("\n## ") and BLOCKS[0][0] == "bash"
    assert [ln.split()[:2] for ln in BLOCKS[0][1].splitlines()] == [["make", "demo"], ["make", "test"]]


@pytest.mark.parametrize("line", RAGPRESS)
def test_ragpress_commands_parse(line):
    from serving.cli import build_parser

    try:
        build_parser().parse_args(_argv(line)[1:])
    except SystemExit as e:
        pytest.fail(f"`ragpress` rejects this README line (exit {e.code}): {line}")


def test_make_targets_exist():
    makefile = (REPO / "Makefile").read_text()
    defined = set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", makefile, flags=re.M))
    cited = {argv[1] for argv in map(_argv, _shell_lines()) if argv[:1] == ["make"] and len(argv) > 1}
    cited |= set(re.findall(r"`make ([A-Za-z0-9_.-]+)", README))
    assert {"demo", "test"} <= cited
    assert cited - defined == set(), f"README cites make targets the Makefile lacks: {sorted(cited - defined)}"


def test_script_paths_exist():
    cited = set(re.findall(r"(?<![\w/])((?:examples|research)/[\w./-]*\w)", README))
    for argv in map(_argv, _shell_lines()):
        if argv[:1] and Path(argv[0]).name in ("python", "python3", "bash", "sh") and argv[1:2] != ["-m"]:
            cited.update(argv[1:2])
    assert cited, "no script named in the README"
    assert sorted(p for p in cited if not (REPO / p).exists()) == []


@pytest.mark.parametrize("src", PYTHON, ids=lambda s: s.splitlines()[0][:60])
def test_python_blocks_compile_and_import(src):
    tree = ast.parse(compile(src, "README.md", "exec", ast.PyCF_ONLY_AST))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = importlib.import_module(node.module)
            missing = [a.name for a in node.names if not hasattr(module, a.name)]
            assert not missing, f"from {node.module} import {', '.join(missing)}: no such name"
        elif isinstance(node, ast.Import):
            for a in node.names:
                importlib.import_module(a.name)


def test_method_table_is_the_registry():
    from compressor import available_compressors

    section = README.split("\n## Methods\n", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| `")]
    names = [re.match(r"\| `([^`]+)` \|", ln).group(1) for ln in rows]
    assert len(names) == len(set(names)), f"a method has two rows: {names}"
    assert {"none", "no_context", "oracle", "bm25", "minilm", "sentinel", "longllmlingua", "icae", "xrag"} <= set(names)
    assert set(names) == set(available_compressors()), "README method table and registry differ"
    assert all(ln.count("|") - ln.count("\\|") == 6 for ln in rows), "each row: name | kind | what | number | card"


def _slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_relative_links_resolve():
    links = re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", README)
    anchors = {_slug(h) for h in re.findall(r"^#+ (.+)$", README, flags=re.M)}
    assert links
    for link in links:
        if re.match(r"[a-z]+:", link):
            continue
        path, _, fragment = link.partition("#")
        if path:
            assert (REPO / path).exists(), f"README links to a missing file: {link}"
        else:
            assert fragment in anchors, f"README links to a missing heading: {link}"
