"""ssacli: attention-saturation diagnostics for Hugging Face transformers.

The public API (the CLI is a thin layer over it: every command is one of these calls):

* :func:`make_scorer`, :func:`describe_scorer`, :data:`SCORERS`: attention scorers (softmax, SSA, …)
  built from spec strings such as ``"ssa:init=faithful,m=256"``.
* :func:`apply_scorer`, :func:`restore`, :func:`supports`, :func:`scorers_of`: run a transformers
  model with any scorer in every attention layer, and go back; :func:`attention_backend` picks a model's
  fused kernels (the default where no weights are needed) or the eager scorer.
* :func:`ssa_attention`: fused SSA attention (native kernels on the CPU, Triton or flex_attention
  on CUDA), no [q, k] weight matrix, forward and backward.
* :func:`diagnose` -> :class:`DiagnoseResult`: probe a model with magnitude shifts and measure
  per-layer, per-head saturation (:func:`diagnose_with`: the same with a :class:`DiagnoseSettings`
  and a :class:`LoadOptions`); :func:`load_model` resolves MODEL references;
  :func:`compare_results` puts two results side by side (``ssacli diagnose``); :func:`load_saved`
  reads a saved result back, :func:`render` / :func:`render_html` draw it again,
  :func:`render_figures` gives its page's figures by name (``--png`` / ``--svg``) and
  ``DiagnoseResult.to_frame`` / ``to_csv`` / ``to_parquet`` export it as a table (``ssacli render``).
  :func:`attribute` -> :class:`Attribution`: how much of a probe's output damage the attention
  patterns of chosen heads carry, by patching the unshifted weights back (docs/diagnose.md;
  :func:`attribute_with`: the same with an :class:`AttributionSettings` and a DiagnoseSettings;
  ``ssacli attribute``; :func:`attribution_html` draws its page, ``Attribution.load`` reads its JSON).
  In a notebook a DiagnoseResult, QualityReport or CheckReport shows its verdict (``_repr_html_``)
  and ``result.plot(kind)`` returns one of its figures (docs/notebooks.md).
* :func:`run_check` -> :class:`CheckReport`: gate a model on requirements; :func:`check_settings`
  merges an ``ssacli.toml`` with explicit options first, :func:`write_check_config` writes one
  measured on a model (``ssacli check``, ``check --init``).
* :func:`convert`: swap a model's scorer and measure its fidelity; :func:`convert_and_finetune`
  fine-tunes the converted model (``ssacli convert [--finetune]``); :func:`convert_with` and
  :func:`convert_and_finetune_with` take their settings as a :class:`ConvertSettings` and a
  LoadOptions.
* :func:`finetune` with a :class:`FinetuneConfig` (:func:`finetune_config` fills it from the run
  recorded in a folder): fine-tune, or continue a run (``ssacli finetune``);
  :func:`train_from_scratch`: a fresh language model and tokenizer, then the same loop
  (``ssacli train``; :func:`train_from_scratch_with`: a :class:`ScratchSettings` and a
  FinetuneConfig); :class:`SaturationCallback` logs per-layer saturation inside a
  ``transformers.Trainer`` every N steps, :class:`SaturationMonitor` is the same for any loop.
* :func:`compare_models` -> :class:`QualityReport`: the before/after report (``ssacli report``;
  :func:`compare_models_with` takes its settings as a :class:`ReportSettings` and a LoadOptions);
  :func:`lm_eval` runs lm-evaluation-harness tasks on a model with its scorer (``report
  --lm-eval``, with an :class:`LMEvalPlan`; the optional extra ``ssacli[eval]``).
* :func:`train_icl` with an :class:`ICLTrainConfig`, :func:`evaluate_icl`, :func:`run_icl_sweep`
  with an :class:`ICLSweepPlan`: the in-context-learning experiments (``ssacli icl``);
  :func:`plot_icl_sweep` draws a sweep's figures from its summary, as ``ssacli icl sweep`` does.

* Settings as values: :class:`DiagnoseSettings` (what a diagnosis probes with and how it reduces),
  :class:`ConvertSettings` (what a conversion measures fidelity on), :class:`ScratchSettings` (what
  ``ssacli train`` builds), :class:`LoadOptions` (how a MODEL loads); :class:`ModelKind` and
  :data:`METRICS` (the per-head metrics, with their descriptions) name what results hold.
* Drawing what the calls return, as the commands do: :func:`render_quality_report` /
  :func:`quality_report_html` (``ssacli report``), :func:`icl_evaluation_tables`,
  :func:`icl_evaluation_legend`, :func:`plot_icl_evaluation` (``icl eval``), :func:`figure_files` (named
  figures as PNG/SVG files marked as ssacli's), :func:`describe_model` (a model's one line),
  :func:`folder_record` / :func:`training_record` (what ssacli keeps in a folder it wrote).
* :mod:`ssacli.preflight`: the checks the commands run before the model stack loads (MODEL
  references, output folders, input files), public so any front end refuses as fast.

Every name but the errors and ``__version__`` is loaded on first use (PEP 562): ``import ssacli``
imports neither torch nor transformers, so the CLI can refuse bad options in well under a second.
It does register ssacli's attention and the model types of converted folders with transformers, at
once if transformers is imported, else as soon as its modules are (:mod:`ssacli.transformers_hook`):
converted folders then load in plain transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from . import display as _display
from . import transformers_hook as _transformers_hook
from .errors import BrokenModelError, InputError, SpecError, SsacliError, UnsupportedModelError
from .version import __version__

# Converted folders load in plain transformers after `import ssacli`: registered now if transformers is
# imported, else right after its import (ssacli/transformers_hook.py; torch-free until then)
_transformers_hook.install()

# What draws each result type in a notebook (`_repr_html_`, `.plot`): the report layer, named here,
# above every layer, so that diagnosis, quality and check never import it (ssacli/display.py says why)
for _type, _drawn in (("DiagnoseResult", "diagnose"), ("QualityReport", "report"), ("CheckReport", "check")):
    _display.bind(_type, f"ssacli.report.notebook:{_drawn}_output", f"ssacli.report.notebook:{_drawn}_plot")
del _type, _drawn

# public name -> "module" (the name is the module's own) or "module:name" (exported under another
# name, where the module's own would be ambiguous at the top level, e.g. icl.train:train)
_LAZY = {
    "SCORERS": "scorers",
    "Scorer": "scorers",
    "describe_scorer": "scorers",
    "make_scorer": "scorers",
    "parse_spec": "scorers",
    "register_scorer": "scorers",
    "scorer_table": "scorers",
    "apply_scorer": "attention.interface",
    "restore": "attention.interface",
    "supports": "attention.interface",
    "scorers_of": "attention.interface",
    "attention_modules": "attention.interface",
    "attention_backend": "attention.interface",
    "ssa_attention": "kernels.fused",
    "diagnose": "diagnosis.run",
    "diagnose_with": "diagnosis.run",
    "attribute": "diagnosis.attribution",
    "attribute_with": "diagnosis.attribution",
    "Attribution": "diagnosis.attribution_result",
    "AttributionSettings": "diagnosis.attribution_settings",
    "attribution_html": "report.attribution_html",
    "load_model": "models.loading",
    "load": "models.loading",
    "convert": "conversion.run",
    "convert_with": "conversion.run",
    "ConvertSettings": "conversion.settings",
    "save_model": "conversion.run",
    "DiagnoseResult": "diagnosis.result",
    "ProbeResult": "diagnosis.result",
    "compare_results": "diagnosis.comparison",
    "load_saved": "report.saved",
    "render": "report.saved",
    "render_html": "report.saved",
    "render_figures": "report.notebook:figure_set",
    "parse_probe": "diagnosis.probe_kinds",
    "run_check": "check.requirements",
    "parse_requirement": "check.requirements",
    "CheckReport": "check.requirements",
    "check_settings": "check.settings",
    "CheckSettings": "check.settings",
    "write_check_config": "check.config",
    "compare_models": "quality.compare",
    "compare_models_with": "quality.compare",
    "ReportSettings": "quality.settings",
    "QualityReport": "quality.result",
    "lm_eval": "quality.harness",
    "LMEvalPlan": "quality.settings",
    "language_model_loss": "quality.measures",
    "minimal_pairs": "quality.measures",
    "icl_error_by_sigma": "quality.measures",
    "finetune": "train.finetune",
    "SaturationCallback": "train.trainer_callback",
    "SaturationMonitor": "train.monitor",
    "FinetuneConfig": "train.finetune_config",
    "finetune_config": "train.runs",
    "convert_and_finetune": "train.runs",
    "convert_and_finetune_with": "train.runs",
    "convert_with_recipe": "train.recipe",
    "softmax_control": "train.recipe",
    "RecipeConfig": "train.recipe_config",  # torch-free: convert checks --control with it first
    "train_from_scratch": "train.runs",
    "train_from_scratch_with": "train.runs",
    "ScratchSettings": "train.settings",
    "train_icl": "icl.train:train",
    "ICLTrainConfig": "icl.train:TrainConfig",
    "evaluate_icl": "icl.evaluate",
    "ICLEvaluation": "icl.evaluate",
    "run_icl_sweep": "icl.sweep:run_sweep",
    "ICLSweepPlan": "icl.sweep:SweepPlan",
    "plot_icl_sweep": "report.plots:plot_sweep",
    "LoadOptions": "models.options",
    "DiagnoseSettings": "diagnosis.settings",
    "ModelKind": "models.kinds",
    "METRICS": "diagnosis.metrics",
    "render_quality_report": "report.before_after:render_report",
    "quality_report_html": "report.before_after:report_html",
    "icl_evaluation_tables": "report.icl:icl_tables",
    "icl_evaluation_legend": "report.icl:icl_legend",
    "plot_icl_evaluation": "report.plots:plot_eval",
    "figure_files": "report.figure_files",
    "describe_model": "train.scratch:describe",
    "folder_record": "models.checkpoint",
    "training_record": "models.checkpoint",
}

if TYPE_CHECKING:
    from .attention.interface import (
        apply_scorer,
        attention_backend,
        attention_modules,
        restore,
        scorers_of,
        supports,
    )
    from .check.config import write_check_config
    from .check.requirements import CheckReport, parse_requirement, run_check
    from .check.settings import CheckSettings, check_settings
    from .conversion.run import convert, convert_with, save_model
    from .conversion.settings import ConvertSettings
    from .diagnosis.attribution import attribute, attribute_with
    from .diagnosis.attribution_result import Attribution
    from .diagnosis.attribution_settings import AttributionSettings
    from .diagnosis.comparison import compare_results
    from .diagnosis.metrics import METRICS
    from .diagnosis.probe_kinds import parse_probe
    from .diagnosis.probe_result import ProbeResult
    from .diagnosis.result import DiagnoseResult
    from .diagnosis.run import diagnose, diagnose_with
    from .diagnosis.settings import DiagnoseSettings
    from .icl.evaluate import ICLEvaluation, evaluate_icl
    from .icl.sweep import SweepPlan as ICLSweepPlan
    from .icl.sweep import run_sweep as run_icl_sweep
    from .icl.train import TrainConfig as ICLTrainConfig
    from .icl.train import train as train_icl
    from .kernels.fused import ssa_attention
    from .models.checkpoint import folder_record, training_record
    from .models.kinds import ModelKind
    from .models.loading import load, load_model
    from .models.options import LoadOptions
    from .quality.compare import compare_models, compare_models_with
    from .quality.harness import lm_eval
    from .quality.measures import icl_error_by_sigma, language_model_loss, minimal_pairs
    from .quality.result import QualityReport
    from .quality.settings import LMEvalPlan, ReportSettings
    from .report.attribution_html import attribution_html
    from .report.before_after import render_report as render_quality_report
    from .report.before_after import report_html as quality_report_html
    from .report.figure_files import figure_files
    from .report.icl import icl_legend as icl_evaluation_legend
    from .report.icl import icl_tables as icl_evaluation_tables
    from .report.notebook import figure_set as render_figures
    from .report.plots import plot_eval as plot_icl_evaluation
    from .report.plots import plot_sweep as plot_icl_sweep
    from .report.saved import load_saved, render, render_html
    from .scorers import (
        SCORERS,
        Scorer,
        describe_scorer,
        make_scorer,
        parse_spec,
        register_scorer,
        scorer_table,
    )
    from .train.finetune import finetune
    from .train.finetune_config import FinetuneConfig
    from .train.monitor import SaturationMonitor
    from .train.recipe import convert_with_recipe, softmax_control
    from .train.recipe_config import RecipeConfig
    from .train.runs import (
        convert_and_finetune,
        convert_and_finetune_with,
        finetune_config,
        train_from_scratch,
        train_from_scratch_with,
    )
    from .train.scratch import describe as describe_model
    from .train.settings import ScratchSettings
    from .train.trainer_callback import SaturationCallback


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'ssacli' has no attribute {name!r}")
    module, _, attribute = _LAZY[name].partition(":")
    return getattr(importlib.import_module(f".{module}", __name__), attribute or name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "Attribution",
    "AttributionSettings",
    "BrokenModelError",
    "CheckReport",
    "CheckSettings",
    "DiagnoseResult",
    "FinetuneConfig",
    "ICLEvaluation",
    "ICLSweepPlan",
    "ICLTrainConfig",
    "InputError",
    "LMEvalPlan",
    "ProbeResult",
    "QualityReport",
    "SCORERS",
    "SaturationCallback",
    "SaturationMonitor",
    "Scorer",
    "SpecError",
    "SsacliError",
    "UnsupportedModelError",
    "__version__",
    "apply_scorer",
    "attention_backend",
    "attention_modules",
    "attribute",
    "attribute_with",
    "attribution_html",
    "check_settings",
    "compare_models",
    "compare_models_with",
    "ReportSettings",
    "compare_results",
    "convert",
    "convert_and_finetune",
    "convert_with_recipe",
    "softmax_control",
    "RecipeConfig",
    "describe_scorer",
    "diagnose",
    "diagnose_with",
    "evaluate_icl",
    "finetune",
    "finetune_config",
    "icl_error_by_sigma",
    "language_model_loss",
    "lm_eval",
    "load",
    "load_model",
    "load_saved",
    "make_scorer",
    "minimal_pairs",
    "parse_probe",
    "parse_requirement",
    "parse_spec",
    "plot_icl_sweep",
    "register_scorer",
    "render",
    "render_figures",
    "render_html",
    "restore",
    "run_check",
    "run_icl_sweep",
    "save_model",
    "scorer_table",
    "scorers_of",
    "ssa_attention",
    "supports",
    "train_from_scratch",
    "train_icl",
    "write_check_config",
    "LoadOptions",
    "DiagnoseSettings",
    "ModelKind",
    "METRICS",
    "render_quality_report",
    "quality_report_html",
    "icl_evaluation_tables",
    "icl_evaluation_legend",
    "plot_icl_evaluation",
    "figure_files",
    "describe_model",
    "folder_record",
    "training_record",
    "ConvertSettings",
    "convert_with",
    "convert_and_finetune_with",
    "ScratchSettings",
    "train_from_scratch_with",
]
