"""``import ssacli`` registers ssacli with transformers, without importing it.

Two things, each once its transformers module is imported: the model types of guarded folders
(``"llama (needs import ssacli)"``, :mod:`ssacli.models.guard_type`) with AutoConfig, when
``transformers.models.auto.configuration_auto`` is (:func:`register_configs`), and the attention
implementation "ssacli" those folders' config.json names, when ``transformers.modeling_utils`` (the
attention registry, imported by every model load) is (:func:`register_attention`). Registering the
attention needs transformers' modeling machinery (and torch), which ``import ssacli`` must not
import (the CLI refuses bad options before either loads). So :func:`install` registers each at once
when its module is already imported, and otherwise puts a finder first on ``sys.meta_path`` that
waits for it: the finder lets the real finders find the module and registers once it has executed
(a post-import hook; transformers has no plugin entry point for model types or attention
implementations), then removes itself once both are done.

What it registers for attention are two small forwarding functions, not ssacli's attention itself:
that module imports transformers' modeling code, so importing it from inside that import (ssacli's
own modules trigger it) would be circular. The first call of either imports
:mod:`ssacli.transformers`, which registers the real functions in their place (and where a module
finds its scorer), and forwards. Torch-free on purpose: this module is imported by ``ssacli``.
"""

from __future__ import annotations

import importlib.abc
import sys
import warnings

from .models.guard_type import guarded_type, keep_guard, plain_config_dict

NAME = "ssacli"  # ssacli.models.guard.ATTENTION_NAME (not imported: that module needs torch)
MODELING = "transformers.modeling_utils"  # holds the attention registry; every model load imports it
CONFIGS = "transformers.models.auto.configuration_auto"  # AutoConfig's model types; torch-free


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


def register_attention() -> None:
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
        _warn(err)


class GuardedConfig:
    """What AutoConfig finds under a guarded model type (``"llama (needs import ssacli)"``,
    :mod:`ssacli.models.guard_type`) once ssacli registered it: ``from_dict`` builds the original
    type's own config (``LlamaConfig``) with the folder's other keys, ``attn_implementation:
    "ssacli"`` among them, so every Auto class and pipeline then builds the original architecture
    with ssacli's attention, as from a folder of guard layout 2. Not a config class itself (one
    class serves every family, and no code sees an instance): the model and its config are the
    original type's, and the config writes the guard back when saved (:func:`keep_guard`)."""

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        plain = plain_config_dict(config_dict)
        built = CONFIG_MAPPING[plain["model_type"]].from_dict(plain, **kwargs)
        keep_guard(built[0] if isinstance(built, tuple) else built, NAME)  # (config, unused kwargs)
        return built


def register_configs() -> None:
    """Register :class:`GuardedConfig` under the guarded type of every model type transformers
    knows (a few hundred dictionary entries: AutoConfig looks a type up by name, with no hook to
    map a name to a type on demand)."""
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES

        for model_type in list(CONFIG_MAPPING_NAMES):
            CONFIG_MAPPING.register(guarded_type(model_type), GuardedConfig, exist_ok=True)
    except Exception as err:  # noqa: BLE001 - the user's import must not fail because of ssacli
        _warn(err)


def register_now() -> None:
    """Register both (what :func:`install` does at once when transformers is already imported)."""
    register_configs()
    register_attention()


def _warn(err: Exception) -> None:
    warnings.warn(
        f"ssacli could not register itself with transformers ({err}); converted folders "
        "will not load in plain transformers until `import ssacli.transformers` succeeds",
        RuntimeWarning,
        stacklevel=3,
    )


_TARGETS = {CONFIGS: register_configs, MODELING: register_attention}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for each module in _TARGETS it asks the other finders, and wraps the
    loader so that the module's registration runs after the module's own code."""

    def __init__(self) -> None:
        self.pending: set[str] = set()

    def find_spec(self, name, path, target=None):
        if name not in self.pending:
            return None
        self.pending.discard(name)  # once
        if not self.pending:
            uninstall()
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None) if finder is not self else None
            spec = find(name, path, target) if find else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run, register = loader.exec_module, _TARGETS[name]

        def exec_module(module):
            run(module)
            register()

        loader.exec_module = exec_module  # this spec's loader instance only
        return spec


_FINDER = _AfterImport()


def install() -> None:
    """Register each part now if its transformers module is imported, else once it is (idempotent)."""
    for name, register in _TARGETS.items():
        if name in sys.modules:
            _FINDER.pending.discard(name)
            register()
        else:
            _FINDER.pending.add(name)
    if _FINDER.pending and _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def uninstall() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)


__all__ = ["GuardedConfig", "install", "register_attention", "register_configs", "register_now", "uninstall"]
