"""ssacli's version: one owner, importable without loading the rest of the package."""

__version__ = "0.1.0"


def software_versions() -> dict[str, str]:
    """The versions a result was made with (ssacli, torch, transformers, python): every result and
    report records them, for reproduction."""
    import platform

    import torch
    import transformers

    return {
        "ssacli": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }
