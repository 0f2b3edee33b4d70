"""The library version, in a module of its own so the families can record it without importing the package
root (``compressor/__init__``), which imports them."""

__version__ = "0.1.0"
