"""``import ssacli`` registers ssacli's attention with transformers, without importing it.

A converted folder says ``attn_implementation: "ssacli"`` (:mod:`ssacli.models.guard`); transformers
builds it only once that name is registered (:mod:`ssacli.transformers`). Registering needs
transformers' modeling machinery (and torch), which ``import ssacli`` must not import (the CLI
refuses bad options before either loads). So :func:`install` registers at once when
``transformers.modeling_utils`` (which holds the attention registry, and which every model load
imports) is already imported, and otherwise puts a finder first on ``sys.meta_path`` that waits for
it: the finder lets the real finders find the module and registers once it has executed (a
post-import hook; transformers has no plugin entry point for attention implementations), then
removes itself.

What it registers are two small forwarding functions, not ssacli's attention itself: that module
imports transformers' modeling code, so importing it from inside that import (ssacli's own modules
trigger it) would be circular. The first call of either imports :mod:`ssacli.transformers`, which
registers the real functions in their place (and where a module finds its scorer), and forwards.
Torch-free on purpose: this module is imported by ``ssacli``.
"""

from __future__ import annotations

import importlib.abc
import sys
import warnings

TARGET = "transformers.modeling_utils"
NAME = "ssacli"  # ssacli.models.guard.ATTENTION_NAME (not imported: that module needs torch)


def _real():
    """ssacli's attention and mask functions, registered in the forwarders' place."""
    import ssacli.transformers  # noqa: F401  (registers the real functions, sets the scorer source)
    from ssacli.attention.forward import ssacli_attention_forward
    from ssacli.attention.interface import ssacli_mask

    return ssacli_attention_forward, ssacli_mask


def _attention(*args, **kwargs):
    return _real()[0](*args, **kwargs)


def _mask(*args, **kwargs):
    return _real()[1](*args, **kwargs)


def register_now() -> None:
    """Register the forwarders under "ssacli", unless ssacli's own functions already are (a failure
    is one warning, never an import error of the user's transformers)."""
    try:
        from transformers.masking_utils import AttentionMaskInterface
        from transformers.modeling_utils import AttentionInterface

        if NAME not in AttentionInterface():  # a MutableMapping over the class-wide registry
            AttentionInterface.register(NAME, _attention)
        if NAME not in AttentionMaskInterface():
            AttentionMaskInterface.register(NAME, _mask)
    except Exception as err:  # noqa: BLE001 - the user's import must not fail because of ssacli
        warnings.warn(
            f"ssacli could not register its attention with transformers ({err}); converted folders "
            "will not load in plain transformers until `import ssacli.transformers` succeeds",
            RuntimeWarning,
            stacklevel=2,
        )


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for TARGET it asks the other finders, and wraps the loader so that
    :func:`register_now` runs after the module's own code."""

    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        uninstall()  # once
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module):
            run(module)
            register_now()

        loader.exec_module = exec_module  # this spec's loader instance only
        return spec


_FINDER = _AfterImport()


def install() -> None:
    """Register now if transformers' modeling code is imported, else once it is (idempotent)."""
    if TARGET in sys.modules:
        register_now()
    elif _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def uninstall() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)


__all__ = ["install", "register_now", "uninstall"]
