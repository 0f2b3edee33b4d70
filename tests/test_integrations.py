"""The LangChain document compressor and the LlamaIndex node postprocessor, with the real packages."""

from __future__ import annotations

import importlib
import sys

import pytest

from compressor import InputError, MissingExtraError, UnknownNameError, get_compressor, registry

HAMLET = ("Hamlet is a tragedy written by William Shakespeare around 1600. It is set in Denmark. The play is long. "
          "Many actors have played the prince.")
CATS = "Cats sleep for most of the day. They purr when content. Some cats like water."
QUESTION = "Who wrote the tragedy Hamlet?"


def test_langchain_document_compressor(counter):
    from langchain_core.documents import BaseDocumentCompressor, Document

    from adapters.integrations import RagpressDocumentCompressor

    docs = [Document(page_content=HAMLET, metadata={"title": "Hamlet", "src": "a"}, id="d1"),
            Document(page_content=CATS, metadata={"src": "b"}, id="d2")]
    comp = RagpressDocumentCompressor(method="bm25", target_tokens=20, counter=counter)
    assert isinstance(comp, BaseDocumentCompressor)
    out = comp.compress_documents(docs, QUESTION)
    ctx = comp.last_context
    assert ctx.tokens_out <= 20 < ctx.tokens_in
    assert [d.page_content for d in out] == [cp.text for cp in ctx.passages if cp.text]
    for d, cp in zip(out, ctx.passages):
        src = docs[cp.index]
        assert d.metadata == src.metadata and d.id == src.id and d.page_content in src.page_content
    assert comp.compress_documents([], QUESTION) == []
    # the ratio path, through a built compressor
    built = RagpressDocumentCompressor(compressor=get_compressor("none", counter=counter))
    assert [d.page_content for d in built.compress_documents(docs, QUESTION)] == [HAMLET, CATS]


def test_llamaindex_node_postprocessor(counter):
    from llama_index.core.postprocessor.types import BaseNodePostprocessor
    from llama_index.core.schema import NodeWithScore, TextNode

    from adapters.integrations import RagpressNodePostprocessor

    nodes = [NodeWithScore(node=TextNode(text=HAMLET, id_="n1", metadata={"title": "Hamlet"}), score=0.9),
             NodeWithScore(node=TextNode(text=CATS, id_="n2"), score=0.4)]
    pp = RagpressNodePostprocessor(method="bm25", ratio=3, counter=counter)
    assert isinstance(pp, BaseNodePostprocessor)
    out = pp.postprocess_nodes(nodes, query_str=QUESTION)
    ctx = pp.last_context
    assert ctx.ratio >= 3 and out
    for n, cp in zip(out, ctx.passages):
        src = nodes[cp.index]
        assert n.node.get_content() == cp.text and n.node.node_id == src.node.node_id and n.score == src.score
        assert n.node.metadata == src.node.metadata
    assert nodes[0].node.get_content() == HAMLET  # the inputs are not mutated
    with pytest.raises(InputError, match="needs the query"):
        pp.postprocess_nodes(nodes)


def test_bad_method_names_and_soft_methods(counter, monkeypatch):
    from adapters.integrations import RagpressDocumentCompressor, RagpressNodePostprocessor

    for cls in (RagpressDocumentCompressor, RagpressNodePostprocessor):
        with pytest.raises(UnknownNameError, match="registered compressors are"):
            cls(method="nope", counter=counter)
    monkeypatch.setitem(registry._REGISTRY, "softy", registry.CompressorSpec(
        "softy", factory=lambda **kw: pytest.fail("never built"), kind="soft", description="test"))
    with pytest.raises(InputError, match="soft prompts"):
        RagpressDocumentCompressor(method="softy", counter=counter)


@pytest.mark.parametrize("module,package", [("langchain", "langchain_core"), ("llamaindex", "llama_index")])
def test_missing_package_names_the_extra(monkeypatch, module, package):
    for name in list(sys.modules):
        if name == package or name.startswith(package + "."):
            monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, package, None)  # makes `import package` fail as if not installed
    monkeypatch.delitem(sys.modules, f"adapters.integrations.{module}", raising=False)
    with pytest.raises(MissingExtraError, match=r"pip install 'ragpress\[integrations\]'"):
        importlib.import_module(f"adapters.integrations.{module}")
