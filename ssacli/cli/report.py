"""`ssacli report BEFORE AFTER [CONTROL]`: quality and attention probes of two models (or three:
CONTROL, e.g. the softmax control trained with AFTER's budget), side by side.

Every input is checked
(text files read, pair files parsed, probe specs and ICL settings parsed) before a model loads, and
output files are rendered in full before either is written, so a failure leaves no file behind.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from .. import LMEvalPlan, LoadOptions, ReportSettings, parse_probe
from ..errors import UsageError
from ..preflight import check_same_kind
from ..setting import setting
from .declared import Given, command, options
from .options import (
    check_inputs,
    floats,
    progress,
    quiet_output,
)
from .page_files import PageFiles


@dataclass(frozen=True)
class ReportOptions:
    """report's options that only the command line has, its files aside (:class:`PageFiles`): the
    built-in measures left out, an earlier report to reuse, and what the terminal shows."""

    no_builtin: bool = setting(False, "Skip the built-in texts and pairs measured where no data is given.")
    reuse_before: Path | None = setting(
        None, "An earlier --json report of the same BEFORE and settings: reuse its BEFORE side.", type=Path
    )
    quiet: bool = quiet_output()


REPORT_OPTIONS = (
    options(ReportSettings, "text_id", "text_ood", "heldout_of", "pairs", "pairs_limit"),
    options(ReportOptions, "no_builtin"),
    LMEvalPlan,
    options(ReportSettings, exclude=("text_id", "text_ood", "heldout_of", "pairs", "pairs_limit")),
    options(
        PageFiles,
        json_out={"help": "Write the report (schema ssacli-report) here; - for stdout."},
        html_out={"help": "Write a self-contained HTML page here."},
    ),
    options(ReportOptions, "reuse_before", "quiet"),
    options(
        LoadOptions, exclude=("revision",)
    ),  # no --revision: two models; each takes its own as org/name@REV
)


Before = Annotated[
    str, typer.Argument(metavar="BEFORE", help="MODEL before the change (folder, builtin:NAME).")
]
After = Annotated[
    str, typer.Argument(metavar="AFTER", help="MODEL after it, e.g. an `ssacli convert` folder.")
]
CONTROL_HELP = "MODEL to hold AFTER against, e.g. convert --control's folder."
Control = Annotated[str, typer.Argument(metavar="CONTROL", help=CONTROL_HELP)]


@command(*REPORT_OPTIONS)
def report_command(before: Before, after: After, control: Control = None, *, given: Given) -> None:
    r"""Compare BEFORE and AFTER: language-model quality (or ICL error) and attention saturation.

    With CONTROL (e.g. the softmax control of convert --finetune --control, trained with AFTER's
    budget), it is measured and probed on the same inputs too, and AFTER is also held against it.

    Language models: loss and perplexity on --text-id and --text-ood, minimal-pair accuracy on --pairs;
    without them, perplexity on the built-in texts and accuracy on 40 built-in English agreement pairs.

    ICL models: error by input σ and with planted outliers.

    Causal LMs, with --lm-eval: lm-evaluation-harness tasks, each model with its own scorer,
    scores ± SE and Δ ± the per-item paired SE.

    Both: the diagnose probes, run with the same seed. Δ is AFTER − BEFORE (and AFTER − CONTROL).

    Examples:

      ssacli report builtin:every-softmax builtin:every-ssa

      ssacli report ./gpt2 ./gpt2-ssa --text-id wiki.txt --text-ood code.txt \
          --pairs blimp/ --html r.html

      ssacli report ./bert ./bert-ssa --pairs blimp/passive_1.jsonl \
          --pairs-limit 0 --json r.json

      ssacli report ./gpt2 ./gpt2-ssa --lm-eval arc_easy,hellaswag \
          --lm-eval-limit 500

      ssacli report ./gpt2 ./gpt2-ssa ./gpt2-control --heldout-of wiki.txt
    """
    out, files = given.of(ReportOptions), given.of(PageFiles)
    probes = _check_first(files, given, (before, after, control))
    settings, load = _settings(given, probes, out.no_builtin), given.of(LoadOptions)
    earlier = _check_measured((before, after, control), settings, out.reuse_before)
    _write(_compare((before, after, control), settings, load, out, earlier), out, files)


def _check_measured(models: tuple, settings: ReportSettings, reuse_before: Path | None) -> dict | None:
    """Before torch: texts and pairs only for models whose folders do not declare another kind than
    a language model; the earlier report to reuse, read once here (its document, or None)."""
    from ..preflight import check_language_models, read_earlier_report

    text = any(v is not None for v in (settings.text_id, settings.text_ood, settings.heldout_of))
    check_language_models(models, text=text, pairs=settings.pairs is not None)
    return None if reuse_before is None else read_earlier_report(reuse_before)


def _compare(
    models: tuple, settings: ReportSettings, load: LoadOptions, out: ReportOptions, earlier: dict | None
) -> dict:
    """compare_models_with() under a status line on stderr: the report as its JSON document."""
    from .. import compare_models_with

    with progress("ssacli report", quiet=out.quiet) as update:
        report = compare_models_with(*models, settings, load, progress=update, before_report=earlier)
    return report.to_dict()  # what is rendered and written: the JSON document


def _check_first(files: PageFiles, given: Given, models: tuple[str | None, ...]) -> list[str] | None:
    """What is checked before anything heavy is imported: the outputs can be written, the probes
    parse, the models are there (or downloaded now); returns the probes as specs."""
    files.check()
    probes = [str(parse_probe(p)) for p in given.probes] if given.probes else None
    check_inputs(models=list(models), offline=given.offline, device=given.device,
                 allow_pickle=given.allow_pickle, dtype=given.dtype, device_map=given.device_map,
                 max_memory=given.max_memory)  # fmt: skip
    check_same_kind(models)  # where the folders' configs say: a causal LM against an encoder
    return probes


def _settings(given: Given, probes: list[str] | None, no_builtin: bool) -> ReportSettings:
    """The ReportSettings of the options, each checked before a model loads: --sigma and --outlier
    are comma-separated, --pairs-limit 0 is all, the --lm-eval options one plan (the paths stay
    paths: compare_models reads them, before a model loads, and names them in the report)."""
    from ..preflight import parse_outlier, read_report_files

    sigma, outlier = given.sigmas, given.outliers
    sigmas = floats(sigma, "sigma")
    if not sigmas or any(not s > 0 for s in sigmas):
        raise UsageError(f"--sigma takes positive numbers, e.g. 1,2,4; got {sigma!r}")
    try:
        outliers = tuple(parse_outlier(v.strip()) for v in outlier.split(",") if v.strip())
    except ValueError as err:
        raise UsageError(str(err)) from None
    plan = None
    if given.tasks is not None:
        from ..preflight import parse_lm_eval_tasks, require_lm_eval

        require_lm_eval()  # before any model loads
        include = None if given.include_path is None else str(given.include_path)
        tasks = parse_lm_eval_tasks(given.tasks)
        plan = given.of(LMEvalPlan, tasks=tasks, include_path=include, batch_size=given.batch_size)
    elif given.num_fewshot is not None or given.limit is not None or given.include_path is not None:
        raise UsageError("--lm-eval-fewshot, --lm-eval-limit and --lm-eval-include need --lm-eval TASKS")
    settings = given.of(
        ReportSettings, pairs_limit=given.pairs_limit or None, probes=probes, sigmas=sigmas,
        outliers=outliers, builtin=not no_builtin, lm_eval_plan=plan,
    )  # fmt: skip
    read_report_files(settings.text_id, settings.text_ood, settings.pairs, settings.pairs_limit,
                      heldout_of=settings.heldout_of)  # fmt: skip  # read again where they are measured
    return settings


def _write(data: dict, out: ReportOptions, files: PageFiles) -> None:
    """The terminal report (unless --quiet), then the files: every output is rendered before the
    first is written."""
    console = Console()
    if not out.quiet:
        from .. import render_quality_report

        render_quality_report(data, console)

    def page() -> str:
        from .. import quality_report_html

        return quality_report_html(data)

    document = lambda: json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n"  # noqa: E731
    files.write(console, document, page, lambda: _figures(data))


def _figures(data: dict) -> list:
    """The report page's named figures (--png, --svg)."""
    from .. import render_figures

    return render_figures(data)
