"""Decoder backends, the one-call pipeline, data loaders, metrics and evaluation.

Not AdapterHub's ``adapters`` package: the two share an import name and cannot live in one environment."""

from .decoders import DecoderBackend, FakeBackend, Generation, GenerationParams, HFBackend
from .pipeline import Answer, RAGPipeline, compress_messages

__all__ = [
    "Answer",
    "DecoderBackend",
    "FakeBackend",
    "Generation",
    "GenerationParams",
    "HFBackend",
    "RAGPipeline",
    "compress_messages",
]
