"""Where models come from; every command that takes a MODEL resolves it here.

MODEL is one of: ``builtin:NAME`` (a checkpoint bundled with ssacli), a local folder (a Hugging Face
``save_pretrained`` folder, an ssacli ICL checkpoint, or a folder written by ``ssacli convert``), or
a Hub id, ``org/name`` or ``org/name@REV``, downloaded into the Hugging Face cache when not there
unless offline (:mod:`ssacli.models.hub`: ``HF_HUB_OFFLINE``, ``--offline``, the commit recorded).
Every loaded model carries which weights it is (:attr:`LoadedModel.weights`: the Hub commit, or a
local folder's content hash, :mod:`ssacli.models.identity`).

Safe by default: weights load from safetensors; a pickle-only checkpoint is refused unless
``allow_pickle`` (and then transformers loads it with ``weights_only=True``); a model that needs code
from its repository (``auto_map`` in config.json) is refused unless ``trust_remote_code``.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from torch import nn

from ..defaults import DEFAULT_MODEL
from ..errors import InputError, UnsupportedModelError, UsageError
from ..setting import settings_from
from .builtins import BUILTIN_DIR, builtin_names  # noqa: F401 (used from here by scripts and tests)
from .checkpoint import attach_saved_scorer, saved_config
from .device_map import check_placement, compute_device, from_pretrained_placed, placement
from .devices import resolve_device
from .first_use import attach_pending
from .hub import HubModel, load_keywords, quiet_progress, resolve
from .icl_task import TOKENS_PER_POINT
from .identity import content_record
from .integrity import (
    TOKENIZER_FILES,
    HeldLoadReport,
    mismatched_shapes,
    require_tokenizer_fits,
    require_whole,
)
from .kinds import ICL_FAMILY, ModelKind, is_local_reference, kind_of, max_positions
from .loaded import LoadedModel
from .options import DTYPE_NAMES, LoadOptions, check_dtype
from .references import (  # noqa: F401 (local_model_path, gguf_file: here too)
    check_weights,
    corrupt_weights,
    gguf_file,
    local_model_path,
    no_config,
    resolve_model_path,
)

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}  # each name's torch dtype


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype | str:
    """``auto`` is float32 on CPU (so large probes are not rounded away) and the checkpoint's own
    dtype on GPU."""
    if dtype == "auto":
        return torch.float32 if device.type == "cpu" else "auto"
    check_dtype(dtype)
    return DTYPES[dtype]


def load_model(ref: str = DEFAULT_MODEL, **options: Any) -> LoadedModel:
    """Load MODEL for probing (eval mode, eager attention until a scorer is applied).

    Keyword arguments: :class:`~ssacli.models.options.LoadOptions`' fields by name (``trust_remote_code``
    runs the Python code a checkpoint ships; only for checkpoints whose code you have read)."""
    return load_with(ref, *settings_from("load_model", options, LoadOptions))


def load_with(ref: str, options: LoadOptions) -> LoadedModel:
    """:func:`load_model` of ``ref``, its options as one value."""
    device_map, max_memory = options.device_map, options.max_memory
    check_placement(device_map, max_memory, options.device)
    placed = placement(device_map, max_memory) if device_map is not None else None
    dev = compute_device(device_map) if placed is not None else resolve_device(options.device)
    torch_dtype = resolve_dtype(options.dtype, dev)
    gguf = gguf_file(ref)
    if gguf is not None and placed is not None:
        raise UsageError("--device-map does not apply to GGUF files (read whole, then dequantized); drop it")
    if gguf is not None:
        return load_gguf(ref, gguf, dev, torch_dtype)
    hub: HubModel | None = None
    if options.revision is not None and is_local_reference(ref):
        raise UsageError(f"--revision applies to Hub ids (org/name), not to the local model '{ref}'")
    if is_local_reference(ref):
        path = resolve_model_path(ref)
        from .icl import is_icl_checkpoint, load_icl

        if is_icl_checkpoint(path):
            if placed is not None:
                raise UsageError(f"'{ref}' is an ssacli ICL model, loaded whole; drop --device-map")
            try:
                model = load_icl(path, dev)
            except (OSError, SafetensorError) as err:
                raise InputError(
                    f"cannot read the weights of '{ref}': {_first_line(err)}; the file is corrupt or "
                    "truncated, re-create or re-download the checkpoint"
                ) from None
            if isinstance(torch_dtype, torch.dtype):
                model = model.to(torch_dtype)
            positions = TOKENS_PER_POINT * model.spec.max_points
            # load_icl refused missing, unexpected and non-finite tensors (an ICL model has no tokenizer)
            return LoadedModel(model, ref, ICL_FAMILY, ModelKind.ICL, None, positions, path,
                               weights=content_record(path))  # fmt: skip
        if not (path / "config.json").is_file():
            raise no_config(ref)
        check_weights(path, options.allow_pickle)
        source: str | Path = path
    else:
        hub = resolve(ref, options.revision, options.offline)  # one line, at once, when it cannot be had
        path, source = None, hub.repo_id
    loaded = _load_transformers(ref, source, path, dev, torch_dtype, options, placed, hub)
    if not _has_attention(loaded.model):
        raise UnsupportedModelError(
            f"'{ref}' (model family '{loaded.family}') has no attention layers (num_hidden_layers = 0?), "
            "so there is nothing for ssacli to measure or swap; give a model with at least one layer"
        )
    return loaded


def as_loaded(
    model: str | Path | nn.Module | LoadedModel, tokenizer: Any = None, options: LoadOptions = LoadOptions()
) -> LoadedModel:
    """What every API function takes as MODEL, as a :class:`LoadedModel`: a reference (path,
    ``builtin:NAME``, Hub id) is loaded with ``options``; a transformers model (with ``.config``) or
    an ssacli ICL model is wrapped as it is, in memory. ``tokenizer`` replaces the loaded one, or
    goes with a module. Each is refused unless whole (:func:`~ssacli.models.integrity.require_whole`);
    a LoadedModel is taken as it is (it was checked where it was made)."""
    if isinstance(model, LoadedModel):
        return model
    if isinstance(model, str | Path):
        loaded = load_with(str(model), options)
        if tokenizer is not None:
            loaded.tokenizer = tokenizer
            require_tokenizer_fits(loaded)
        return loaded
    if not isinstance(model, nn.Module):
        raise UsageError(f"model must be a path, a model id or a torch module, got {type(model).__name__}")
    spec = getattr(model, "spec", None)
    if spec is not None and hasattr(model, "backbone"):  # an ICL model
        icl = LoadedModel(
            model, "ICLModel", ICL_FAMILY, ModelKind.ICL, None, TOKENS_PER_POINT * spec.max_points
        )
        require_whole(icl)
        return icl
    config = getattr(model, "config", None)
    if config is None:
        raise UsageError("model must be a transformers model (with .config) or an ssacli ICL model")
    attach_pending(model)  # a converted folder loaded by plain transformers, not yet run: its scorers
    name = getattr(config, "name_or_path", "") or type(model).__name__
    commit = getattr(config, "_commit_hash", None)  # set by from_pretrained of a Hub id
    weights = {"repo": name, "revision": None, "commit": commit} if isinstance(commit, str) else None
    loaded = LoadedModel(
        model, name, config.model_type, kind_of(model), tokenizer, max_positions(config), weights=weights
    )
    require_whole(loaded)  # built in memory: no loading report, but its numbers and tokenizer
    return loaded


# ---- GGUF checkpoints (optional extra: pip install "ssacli[gguf]") -----------------------------------


def load_gguf(ref: str, file: Path, device: torch.device, torch_dtype) -> LoadedModel:
    """A GGUF checkpoint through transformers' GGUF reader, dequantized to ``torch_dtype``
    (float32 when "auto" leaves it to the checkpoint: quantized blocks have no torch dtype)."""
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        import gguf  # noqa: F401
    except ImportError:
        raise UsageError(
            f"'{ref}' is a GGUF file; reading it needs the gguf package: pip install \"ssacli[gguf]\""
        ) from None
    folder, name = file.parent, file.name
    dtype = torch_dtype if isinstance(torch_dtype, torch.dtype) else torch.float32
    try:
        with quiet_progress():
            config = AutoConfig.from_pretrained(folder, gguf_file=name, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(
                folder, gguf_file=name, dtype=dtype, attn_implementation="eager", local_files_only=True
            )
    except (ValueError, KeyError, NotImplementedError) as err:
        raise UnsupportedModelError(
            f"'{ref}': transformers {transformers.__version__} cannot read this GGUF checkpoint "
            f"({_first_line(err)}); it reads the GGUF architectures listed in its GGUF documentation "
            "(llama, mistral, qwen2, gemma, phi3, gpt2, …); convert other files to safetensors"
        ) from None
    except OSError as err:
        raise InputError(f"cannot read GGUF file '{ref}': {_first_line(err)}; is it complete?") from None
    missing = None
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    except (OSError, ValueError, TypeError, KeyError) as err:
        tokenizer, missing = None, f"its GGUF tokenizer did not load ({_first_line(err)})"
    model = model.to(device).eval()
    positions = max_positions(config)
    loaded = LoadedModel(model, ref, config.model_type, kind_of(model), tokenizer, positions, folder, missing,
                         content_record(file))  # fmt: skip
    require_whole(loaded)
    return loaded


def load(ref: str = DEFAULT_MODEL, **kwargs: Any) -> nn.Module:
    """The model behind MODEL, ready to use, with its ssacli scorer when it was converted
    (``ssacli.load(DIR)``); keyword arguments as :func:`load_model`."""
    return load_model(ref, **kwargs).model


def _has_attention(model: nn.Module) -> bool:
    """Whether the model has a module that computes attention weights (what ssacli measures): one on
    the registry, or one named so off it (why a name: attention.interface.named_attention)."""
    from ..attention.interface import attention_modules, named_attention

    return any(True for _ in attention_modules(model)) or any(named_attention(m) for m in model.modules())


def _load_transformers(
    ref, source, path, device, torch_dtype, options: LoadOptions, placed: dict[str, Any] | None,
    hub: HubModel | None,
) -> LoadedModel:  # fmt: skip
    import transformers
    from transformers import AutoConfig, AutoModel

    trust, allow_pickle = options.trust_remote_code, options.allow_pickle
    at = load_keywords(hub)  # a Hub model: its resolved commit, from the cache or downloaded
    # A folder ssacli guarded against plain transformers (its scorer is not softmax) names its real
    # model type only for ssacli; the model is then built from that config, not from config.json.
    guarded = saved_config(path) if path is not None else None
    try:
        config = guarded or AutoConfig.from_pretrained(source, trust_remote_code=trust, **at)
    except ValueError as err:  # unknown model_type, or a config that needs remote code
        if "trust_remote_code" in str(err) or "remote code" in str(err):
            raise UnsupportedModelError(
                f"'{ref}' needs custom code from its repository (auto_map in config.json), which ssacli "
                "does not run by default; read that code, then pass --trust-remote-code to run it"
            ) from None
        model_type = _config_model_type(path)
        if model_type is not None and "does not recognize this architecture" in str(err):
            raise InputError(
                f"'{ref}' has model type '{model_type}', which transformers {transformers.__version__} "
                "does not know; check model_type in its config.json, or upgrade transformers"
            ) from None
        raise InputError(
            f"cannot read the config of '{ref}': {_first_line(err)}; check its config.json"
        ) from None
    except OSError as err:
        if hub is not None:
            raise InputError(
                f"cannot read the config of '{hub.repo_id}' at commit {hub.commit[:12]}: {_first_line(err)}"
                "; check the network, or its files in the Hugging Face cache"
            ) from None
        raise InputError(
            f"cannot read the config of '{ref}': {_first_line(err)}; check that the folder holds a "
            "complete checkpoint"
        ) from None
    cls = _model_class(config, transformers) or AutoModel
    kwargs = {
        "dtype": torch_dtype,
        "attn_implementation": "eager",
        "trust_remote_code": trust,
        **at,
    }
    if guarded is not None:
        kwargs["config"] = guarded
    if allow_pickle:
        kwargs["weights_only"] = True  # torch.load refuses anything but tensors and plain containers
    else:
        kwargs["use_safetensors"] = True
    kwargs["output_loading_info"] = True  # what the checkpoint lacked: require_whole, not a logged table
    report_log = HeldLoadReport()
    try:
        with quiet_progress(), report_log.held():
            model, report = from_pretrained_placed(cls, source, kwargs, placed)
    except SafetensorError as err:  # a corrupt or truncated .safetensors file
        raise corrupt_weights(ref, err) from None
    except (OSError, ValueError, RuntimeError, EOFError, pickle.UnpicklingError) as err:
        if "ignore_mismatched_sizes" in str(err):  # transformers names the tensors only in its report
            raise mismatched_shapes(ref, report_log.text) from None
        hint = "" if allow_pickle else " (only safetensors weights are read unless --allow-pickle)"
        raise InputError(
            f"cannot load the weights of '{ref}': {_first_line(err)}{hint}; check that the checkpoint is "
            "complete"
        ) from None
    model = model.eval() if placed is not None else model.to(device).eval()  # placed: never moved
    spec = getattr(config, "ssacli_scorer", None)
    if spec is not None and path is not None:  # a folder written by `ssacli convert` or fine-tuning
        attach_saved_scorer(model, path, spec)
    tokenizer, missing = _tokenizer(source, path, at, trust, guarded)
    weights = hub.record() if hub is not None else content_record(path)
    family, positions = config.model_type, max_positions(config)
    loaded = LoadedModel(model, ref, family, kind_of(model), tokenizer, positions, path, missing, weights)
    require_whole(loaded, report)
    return loaded


def _model_class(config, transformers) -> type | None:
    """The checkpoint's own architecture class (task head included), when transformers has it."""
    for name in getattr(config, "architectures", None) or ():
        cls = getattr(transformers, name, None)
        if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel):
            return cls
    return None


def _tokenizer(source, path: Path | None, at: dict[str, Any], trust: bool = False, config: Any = None):
    """(the tokenizer, None) or (None, why there is none: what :meth:`LoadedModel.require_tokenizer`
    says)."""
    if path is not None and not any((path / f).is_file() for f in TOKENIZER_FILES):
        return None, f"its folder has none of {', '.join(TOKENIZER_FILES)}"
    from transformers import AutoTokenizer

    extra = {} if config is None else {"config": config}  # a guarded config.json is not read
    try:
        return AutoTokenizer.from_pretrained(source, trust_remote_code=trust, **at, **extra), None
    except (OSError, ValueError, TypeError, KeyError) as err:
        return None, f"its tokenizer did not load ({_first_line(err)})"


def _config_model_type(path: Path | None) -> str | None:
    """model_type as config.json spells it (None when unreadable)."""
    if path is None:
        return None
    try:
        value = json.loads((path / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0].rstrip(". ") if text else type(err).__name__
