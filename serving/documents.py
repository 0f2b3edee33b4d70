"""Where a request's documents come from, and where the compressed text goes back.

Two sources, compressed together in one call (the budget is shared):

1. ``documents`` in the request body (strings or ``{id, title, text}``): inserted, compressed, as a
   ``Documents:`` block before the last user message (``Question: ...`` after it), exactly as
   :func:`adapters.pipeline.compress_messages` does; for ``/v1/completions`` the block goes before the prompt.
2. Documents marked inside message text (or a completion prompt)::

       <document>text</document>
       <document title="Hamlet" id="d1">text</document>

   Each block keeps its tags and gets the kept text in place; a document with nothing kept is removed, tags
   and all. Text outside the tags, the user's instructions and question, is never touched.

The query the documents are scored against is the last user message (or the prompt) with its marked
blocks removed.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from typing import Any

from adapters.pipeline import documents_block, with_documents
from compressor.base import CompressedContext, CompressedPassage, Passage
from compressor.errors import InputError

__all__ = ["Marked", "ExtractedDocs", "extract_chat", "extract_prompt", "render_chat", "render_prompt"]

# A block is an opening tag, then everything up to the first "</document>". Found with str.find, not one
# regex with a lazy body: that rescans to the end of the text for every unclosed tag (quadratic: 160 KB of
# "<document>" took 12 s on the event loop).
_OPEN_TAG = re.compile(r"<document(?P<attrs>(?:\s+[A-Za-z_]+\s*=\s*\"[^\"]*\")*)\s*>")
_CLOSE_TAG = "</document>"
_OPEN = re.compile(r"<document[\s>]")
_ATTR = re.compile(r"([A-Za-z_]+)\s*=\s*\"([^\"]*)\"")
_ALLOWED_ATTRS = ("title", "id")


@dataclass(frozen=True)
class Marked:
    """One ``<document>`` block: where it sits (``where`` names the message/part) and its char span."""

    where: tuple[int, int | None]
    start: int
    end: int
    open_tag: str
    passage: Passage
    label: str = ""  # where it sits, for error messages: "messages[1].content, <document> block 0"


@dataclass
class ExtractedDocs:
    """All documents of one request, body documents first, then marked ones in reading order."""

    body: list[Passage] = field(default_factory=list)
    marked: list[Marked] = field(default_factory=list)
    query: str = ""

    @property
    def passages(self) -> list[Passage]:
        return self.body + [m.passage for m in self.marked]

    def __len__(self) -> int:
        return len(self.body) + len(self.marked)

    def labels(self) -> list[str]:
        """Where each of :attr:`passages` came from, as error messages name it."""
        return [f"documents[{i}]" for i in range(len(self.body))] + [m.label for m in self.marked]


def _body_passages(documents: list[Any] | None) -> list[Passage]:
    out = []
    for i, d in enumerate(documents or []):
        text, title, did = (d, None, None) if isinstance(d, str) else (d.text, d.title, d.id)
        if not text.strip():
            raise InputError(f"documents[{i}] is blank; drop it or give it text")
        out.append(Passage(text=text, title=title, id=did))
    return out


def _find_marked(text: str, where: tuple[int, int | None], label: str) -> tuple[list[Marked], str]:
    """The blocks in ``text`` and the text with them removed."""
    found, rest, pos = [], [], 0
    while (m := _OPEN_TAG.search(text, pos)) is not None:
        close = text.find(_CLOSE_TAG, m.end())
        if close < 0:  # no block after this one can close either
            break
        attrs = {k: html.unescape(v) for k, v in _ATTR.findall(m.group("attrs"))}
        bad = sorted(set(attrs) - set(_ALLOWED_ATTRS))
        if bad:
            raise InputError(f"{label}: <document> attribute {bad[0]!r} is not supported; use title=\"...\" "
                             "and id=\"...\"")
        body = text[m.end(): close]
        if not body.strip():
            raise InputError(f"{label}: a <document> block is empty; remove it or give it text")
        end = close + len(_CLOSE_TAG)
        found.append(Marked(where, m.start(), end, m.group(),
                            Passage(text=body, title=attrs.get("title"), id=attrs.get("id")),
                            label=f"{label}, <document> block {len(found)}"))
        rest.append(text[pos: m.start()])
        pos = end
    rest.append(text[pos:])
    remaining = "".join(rest)
    if _OPEN.search(remaining):
        raise InputError(f"{label}: a <document> tag is not closed (or its attributes are malformed); write "
                         "<document title=\"...\">text</document>")
    return found, remaining


def _texts(content: str | list[dict[str, Any]] | None) -> list[tuple[int | None, str]]:
    """(part index or None, text) for every text piece of a message content."""
    if isinstance(content, str):
        return [(None, content)]
    if isinstance(content, list):
        return [(j, p["text"]) for j, p in enumerate(content) if p.get("type") == "text" and isinstance(p.get("text"), str)]
    return []


def extract_chat(messages: list[dict[str, Any]], documents: list[Any] | None) -> ExtractedDocs:
    """Find body and marked documents of a chat request and the query (last user message, blocks removed)."""
    out = ExtractedDocs(body=_body_passages(documents))
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
    for i, m in enumerate(messages):
        for j, text in _texts(m.get("content")):
            label = f"messages[{i}].content" + (f"[{j}].text" if j is not None else "")
            found, remaining = _find_marked(text, (i, j), label)
            out.marked += found
            if i == last_user:
                out.query += remaining
    if len(out) and last_user is None:
        raise InputError("documents need a user message holding the question")
    if len(out) and not out.query.strip():
        raise InputError(f"messages[{last_user}] has no question outside its <document> blocks; add the question "
                         "so the documents can be compressed against it")
    out.query = out.query.strip()
    return out


def extract_prompt(prompt: str, index: int, documents: list[Any] | None) -> ExtractedDocs:
    """The same for one completion prompt: the query is the prompt with its marked blocks removed."""
    out = ExtractedDocs(body=_body_passages(documents))
    out.marked, remaining = _find_marked(prompt, (index, None), f"prompt[{index}]")
    if len(out) and not remaining.strip():
        raise InputError(f"prompt[{index}] has no text outside its <document> blocks to compress against")
    out.query = remaining.strip()
    return out


def _kept(ctx: CompressedContext | None, n: int) -> list[CompressedPassage | None]:
    """Per input passage, what is left of it (None: dropped); ``ctx`` None means uncompressed."""
    if ctx is None:
        return [None] * n
    by_index: list[CompressedPassage | None] = [None] * n
    for p in ctx.passages:
        if p.text:
            by_index[p.index] = p
    return by_index


def _replace_marked(text: str, marks: list[Marked], kept: list[CompressedPassage | None]) -> str:
    pieces, pos = [], 0
    for m, k in zip(marks, kept):
        pieces.append(text[pos: m.start])
        if k is not None:
            pieces.append(f"{m.open_tag}{k.text}</document>")
        pos = m.end
    pieces.append(text[pos:])
    return "".join(pieces)


def _uncompressed(p: Passage, i: int) -> CompressedPassage:
    return CompressedPassage(index=i, title=p.title, text=p.text)


def render_chat(messages: list[dict[str, Any]], docs: ExtractedDocs,
                ctx: CompressedContext | None) -> list[dict[str, Any]]:
    """The messages to send upstream: marked blocks shortened in place, body documents as a block before the
    last user message. ``ctx`` None: compression off, documents pass in full (marked ones byte for byte)."""
    nb = len(docs.body)
    kept = _kept(ctx, len(docs))
    out = [dict(m) for m in messages]
    if ctx is not None and docs.marked:
        groups: dict[tuple[int, int | None], list[int]] = {}
        for k, m in enumerate(docs.marked):
            groups.setdefault(m.where, []).append(k)
        for (i, j), ks in groups.items():
            marks, kk = [docs.marked[k] for k in ks], [kept[nb + k] for k in ks]
            if j is None:
                out[i]["content"] = _replace_marked(out[i]["content"], marks, kk)
            else:
                parts = [dict(p) for p in out[i]["content"]]
                parts[j]["text"] = _replace_marked(parts[j]["text"], marks, kk)
                out[i]["content"] = parts
    body_kept = ([k for k in kept[:nb] if k is not None] if ctx is not None
                 else [_uncompressed(p, i) for i, p in enumerate(docs.body)])
    if body_kept:
        last = max(i for i, m in enumerate(out) if m.get("role") == "user")
        block = documents_block(body_kept)
        content = out[last].get("content")
        if isinstance(content, list):
            out[last]["content"] = [{"type": "text", "text": f"{block}\n\nQuestion: "}, *content]
        else:
            out[last]["content"] = with_documents(body_kept, content or "")
    return out


def render_prompt(prompt: str, docs: ExtractedDocs, ctx: CompressedContext | None) -> str:
    """A completion prompt with marked blocks shortened in place and body documents in a block before it."""
    nb = len(docs.body)
    kept = _kept(ctx, len(docs))
    if ctx is not None and docs.marked:
        prompt = _replace_marked(prompt, docs.marked, kept[nb:])
    body_kept = ([k for k in kept[:nb] if k is not None] if ctx is not None
                 else [_uncompressed(p, i) for i, p in enumerate(docs.body)])
    return f"{documents_block(body_kept)}\n\n{prompt}" if body_kept else prompt
