"""Checks a front end runs before the model stack loads: public, so that any caller (the CLI, a
service, a notebook) refuses bad input as fast and with the same messages as ``ssacli`` does.

Every name is loaded on first use (PEP 562), like the names of :mod:`ssacli`; ``import
ssacli.preflight`` imports nothing else, and most checks stay torch-free (those that are not say so).

MODEL references and model folders:

* :func:`check_model_reference` (a builtin that is not bundled, a local path that does not exist, an
  offline Hub id not in the cache: refused as loading would), :func:`fetch_model_reference` (a Hub id
  downloaded now, before any live display), :func:`local_model_path` (the folder MODEL names, or
  None), :func:`builtin_model_names` (the bundled models); a local folder is read as far as its headers go
  (config.json, weights, safetensors headers);
* :func:`check_same_kind` (the models a report compares: of one kind, where their folders say),
  :func:`check_icl_model` (``icl eval``'s MODEL: an ICL model, where its folder says),
  :func:`check_prompt_source` (``--text`` only for a MODEL that is not an ICL model, where its
  folder says);
* :func:`check_device` (``--device``: a name it takes, and a CUDA device that can be there; torch
  alone, never transformers, where only torch can tell), :func:`check_dtype` (``--dtype``: auto or
  a dtype a model loads in), :func:`check_placement` (``--device-map`` and ``--max-memory``: a map
  it takes, a memory limit with a map, accelerate installed);
* :func:`check_model_out` (``--out`` of a command that writes a model folder: never over its input,
  over someone else's folder, or where nothing can be written), :func:`reusable_control` (a finished
  softmax control in a folder that a recipe run can read instead of training it again),
  :func:`training_folder` (where a fine-tuning run writes: refuses a DIR that names nothing without
  ``--out``, and ``--in-place`` with another ``--out``), :func:`check_new_run` (a fresh model's
  ``--out`` that holds a run already), :func:`check_scratch_arch` (``train
  --arch``: one a built-in size builds), :func:`read_scratch_size` (``train --size``: a built-in
  size with an arch, or a config.json);

Outputs:

* :func:`check_figure_folder` (``--png`` / ``--svg`` folders), :func:`check_replaceable_file` (an
  output file is replaced only when ssacli wrote it, or with ``overwrite``), :func:`require_frame_format`
  (Parquet needs the ``ssacli[frame]`` extra).

Inputs and options:

* :func:`read_text_file` (a UTF-8 text with some text in it), :func:`read_report_files` (the
  texts and minimal pairs a report measures on), :func:`check_language_models` (texts and pairs
  only for models whose folders do not declare another kind), :func:`read_earlier_report` (an
  earlier report's JSON document, ``--reuse-before``), :func:`read_saved_result` (a saved
  diagnose result or comparison as its JSON document: ``ssacli render``'s RESULT),
  :func:`parse_outlier` (an ICL outlier ``SIGMA@POSITION``), :func:`check_icl_task` (an ICL
  task's name), :func:`check_icl_arch` and :func:`check_icl_preset` (a new ICL model's backbone and
  size preset), :func:`pick_heatmap` (the probe a heatmap ``METRIC[@PROBE]`` is drawn from, or a
  UsageError), :func:`require_lm_eval`
  and :func:`parse_lm_eval_tasks` (the optional lm-evaluation-harness and its task list);
  :func:`check_attribution_probe` (a probe attribution can patch, and its shifted level),
  :func:`check_attribution_prompts` (prompts it can patch under that probe),
  :func:`check_attribution_model` (a MODEL folder of the causal kind, the heads asked for within the
  layers and heads its config.json declares),
  :func:`parse_heads` (``L2H1,L3H0`` as (layer, head) pairs);
* :data:`DEVICE_MAPS` (what ``device_map`` takes), :data:`DATA_FORMS` (what training ``data``
  takes), :func:`require_training_data` (a run without it), :func:`check_training_data` (an
  ``icl:TASK`` that names a task), :func:`check_data_fits` (``--data`` of the form the model
  folder's kind trains on), :func:`check_recipe_model` (a model folder the recipe can distil: a
  causal LM), :func:`require_text_data` (a fresh
  language model's: text that is there), :data:`MIN_VOCAB` (the smallest
  vocabulary a fresh model's tokenizer can have),
  :data:`CHECK_CONFIG_FILE` (what ``check`` reads from the working folder when no config is given).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# public name -> "module:name" under ssacli (the owner keeps its own name where it says what it is)
_LAZY = {
    "check_model_reference": "models.references:check_reference",
    "fetch_model_reference": "models.references:fetch_reference",
    "local_model_path": "models.references:local_model_path",
    "builtin_model_names": "models.builtins:builtin_names",
    "check_model_out": "conversion:check_out",
    "check_device": "models.devices:check_device",
    "check_dtype": "models.options:check_dtype",
    "check_placement": "models.device_map:check_placement",
    "check_same_kind": "models.references:check_same_kind",
    "check_icl_model": "models.references:check_icl_model",
    "check_prompt_source": "models.references:check_prompt_source",
    "reusable_control": "train.recipe_config:reusable_control",
    "check_figure_folder": "report.figure_files:check_figure_folder",
    "check_replaceable_file": "report.replaceable:check_replaceable",
    "require_frame_format": "diagnosis.frames:require_frame_format",
    "read_text_file": "quality.inputs:read_text_file",
    "read_report_files": "quality.inputs:read_report_files",
    "check_language_models": "quality.inputs:check_language_models",
    "read_earlier_report": "quality.result:read_report",
    "read_saved_result": "documents:read_saved",
    "parse_outlier": "models.icl_settings:parse_outlier",
    "check_icl_task": "models.icl_settings:check_task",
    "check_attribution_probe": "diagnosis.attribution_result:check_probe",
    "check_attribution_prompts": "diagnosis.attribution_result:check_prompts",
    "check_attribution_model": "diagnosis.attribution_result:check_model",
    "parse_heads": "diagnosis.attribution_result:parse_heads",
    "pick_heatmap": "report.summary:pick_heatmap",
    "require_lm_eval": "quality.harness:require_harness",
    "parse_lm_eval_tasks": "quality.harness:parse_tasks",
    "DEVICE_MAPS": "models.device_map:DEVICE_MAPS",
    "DATA_FORMS": "train:DATA_FORMS",
    "require_training_data": "train:require_data",
    "check_training_data": "train:check_data",
    "check_data_fits": "train:check_data_fits",
    "check_recipe_model": "train.recipe_config:check_recipe_model",
    "require_text_data": "train:require_text_data",
    "training_folder": "train.folders:training_folder",
    "check_new_run": "train.folders:check_new_run",
    "check_icl_arch": "models.icl_settings:check_arch",
    "check_icl_preset": "models.icl_settings:check_preset",
    "check_scratch_arch": "train.settings:check_arch",
    "read_scratch_size": "train.settings:read_size",
    "MIN_VOCAB": "train:MIN_VOCAB",
    "CHECK_CONFIG_FILE": "check.config:CONFIG_FILE",
}

if TYPE_CHECKING:
    from .check.config import CONFIG_FILE as CHECK_CONFIG_FILE
    from .conversion import check_out as check_model_out
    from .diagnosis.attribution_result import check_model as check_attribution_model
    from .diagnosis.attribution_result import check_probe as check_attribution_probe
    from .diagnosis.attribution_result import check_prompts as check_attribution_prompts
    from .diagnosis.attribution_result import parse_heads
    from .diagnosis.frames import require_frame_format
    from .documents import read_saved as read_saved_result
    from .models.builtins import builtin_names as builtin_model_names
    from .models.device_map import DEVICE_MAPS, check_placement
    from .models.devices import check_device
    from .models.icl_settings import check_arch as check_icl_arch
    from .models.icl_settings import check_preset as check_icl_preset
    from .models.icl_settings import check_task as check_icl_task
    from .models.icl_settings import parse_outlier
    from .models.options import check_dtype
    from .models.references import check_icl_model, check_prompt_source, check_same_kind, local_model_path
    from .models.references import check_reference as check_model_reference
    from .models.references import fetch_reference as fetch_model_reference
    from .quality.harness import parse_tasks as parse_lm_eval_tasks
    from .quality.harness import require_harness as require_lm_eval
    from .quality.inputs import check_language_models, read_report_files, read_text_file
    from .quality.result import read_report as read_earlier_report
    from .report.figure_files import check_figure_folder
    from .report.replaceable import check_replaceable as check_replaceable_file
    from .report.summary import pick_heatmap
    from .train import DATA_FORMS, MIN_VOCAB, check_data_fits, require_text_data
    from .train import check_data as check_training_data
    from .train import require_data as require_training_data
    from .train.folders import check_new_run, training_folder
    from .train.recipe_config import check_recipe_model, reusable_control
    from .train.settings import check_arch as check_scratch_arch
    from .train.settings import read_size as read_scratch_size


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'ssacli.preflight' has no attribute {name!r}")
    module, _, attribute = _LAZY[name].partition(":")
    return getattr(importlib.import_module(f"ssacli.{module}"), attribute)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "CHECK_CONFIG_FILE",
    "DATA_FORMS",
    "DEVICE_MAPS",
    "MIN_VOCAB",
    "builtin_model_names",
    "check_attribution_model",
    "check_attribution_probe",
    "check_attribution_prompts",
    "check_device",
    "check_dtype",
    "check_figure_folder",
    "check_icl_model",
    "check_icl_task",
    "check_prompt_source",
    "check_model_out",
    "check_model_reference",
    "check_placement",
    "parse_heads",
    "check_replaceable_file",
    "check_scratch_arch",
    "read_scratch_size",
    "check_training_data",
    "check_data_fits",
    "check_recipe_model",
    "check_same_kind",
    "fetch_model_reference",
    "local_model_path",
    "parse_lm_eval_tasks",
    "parse_outlier",
    "pick_heatmap",
    "read_report_files",
    "check_language_models",
    "read_earlier_report",
    "read_saved_result",
    "read_text_file",
    "require_frame_format",
    "require_lm_eval",
    "require_text_data",
    "require_training_data",
    "reusable_control",
    "training_folder",
    "check_new_run",
    "check_icl_arch",
    "check_icl_preset",
]
