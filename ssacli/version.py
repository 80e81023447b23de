"""ssacli's version: one owner, importable without loading the rest of the package."""

__version__ = "0.1.0"
