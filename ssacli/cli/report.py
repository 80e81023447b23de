"""`ssacli report BEFORE AFTER [CONTROL]`: quality and attention probes of two models (or three:
CONTROL, e.g. the softmax control trained with AFTER's budget), side by side.

Every input is checked
(text files read, pair files parsed, probe specs and ICL settings parsed) before a model loads, and
output files are rendered in full before either is written, so a failure leaves no file behind.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from .. import defaults, parse_probe
from ..errors import UsageError
from .options import (
    ICL_OUTLIERS_TEXT,
    ICL_SIGMAS_TEXT,
    AllowDownload,
    AllowPickle,
    Device,
    DeviceMap,
    Dtype,
    MaxMemory,
    Offline,
    OverwriteFiles,
    PngDir,
    QuietOutput,
    SvgDir,
    TrustRemoteCode,
    check_inputs,
    check_outputs,
    floats,
    load_options,
    progress,
)
from .outputs import check_figure_outputs, figure_outputs, write_figure_outputs, write_output


def report_command(
    before: str = typer.Argument(
        ..., metavar="BEFORE", help="MODEL before the change (folder, builtin:NAME)."
    ),
    after: str = typer.Argument(
        ..., metavar="AFTER", help="MODEL after it, e.g. an `ssacli convert` folder."
    ),
    control: str = typer.Argument(
        None, metavar="CONTROL", help="MODEL to hold AFTER against, e.g. convert --control's folder."
    ),
    text_id: Path = typer.Option(None, help="UTF-8 text like the training data: LM loss, perplexity."),
    text_ood: Path = typer.Option(None, help="UTF-8 text unlike it: out-of-distribution LM loss."),
    heldout_of: Path = typer.Option(
        None, help="Training --data: its held-out last tenth is the in-distribution text (or --text-id)."
    ),
    pairs: Path = typer.Option(None, help="BLiMP-style .jsonl (sentence_good, sentence_bad) or a folder."),
    pairs_limit: int = typer.Option(
        defaults.PAIRS_LIMIT, min=0, help="Pairs per file (its first N; 0 = all)."
    ),
    no_builtin: bool = typer.Option(
        False, "--no-builtin", help="Skip the built-in texts and pairs measured where no data is given."
    ),
    lm_eval: str = typer.Option(
        None,
        "--lm-eval",
        metavar="TASKS",
        help="lm-evaluation-harness tasks (names or task YAML files, comma-separated) on both; "
        'needs pip install "ssacli\\[eval]"; data downloads unless --offline.',
    ),  # fmt: skip
    lm_eval_fewshot: int = typer.Option(
        None, min=0, help="--lm-eval: few-shot examples (default: each task's own)."
    ),
    lm_eval_limit: int = typer.Option(
        None, min=1, help="--lm-eval: the first N items of each task (default: all)."
    ),
    lm_eval_include: Path = typer.Option(None, help="--lm-eval: a folder of task YAML files to add."),
    probe: list[str] = typer.Option(None, help="Diagnose probe NAME[:L1,L2,…] (repeatable; default all)."),
    seed: int = typer.Option(
        defaults.SEED, help="One seed for both models: masking, ICL prompts, probe inputs."
    ),
    samples: int = typer.Option(defaults.SAMPLES, min=1, help="Sequences per probe level."),
    random_ids: bool = typer.Option(
        False, "--random", help="Probe with random token ids (needed for a model without a tokenizer)."
    ),
    seq_len: int = typer.Option(
        defaults.LM_SEQ_LEN, min=2, help="LM loss window in tokens (capped at the model's)."
    ),
    max_tokens: int = typer.Option(
        defaults.LM_MAX_TOKENS, min=2, help="LM loss reads at most this many tokens per text."
    ),
    batch_size: int = typer.Option(defaults.BATCH_SIZE, min=1, help="Windows per forward pass."),
    sigma: str = typer.Option(ICL_SIGMAS_TEXT, help="ICL models: σ of the inputs, comma-separated."),
    outlier: str = typer.Option(ICL_OUTLIERS_TEXT, help="ICL models: VALUE@POSITION outliers ('' = none)."),
    icl_length: int = typer.Option(defaults.ICL_POINTS, min=2, help="ICL models: points per prompt."),
    prompts: int = typer.Option(defaults.ICL_PROMPTS, min=1, help="ICL models: prompts per cell."),
    json_out: Path = typer.Option(
        None, "--json", help="Write the report (schema ssacli-report) here; - for stdout."
    ),
    html_out: Path = typer.Option(None, "--html", help="Write a self-contained HTML page here."),
    overwrite: OverwriteFiles = False,
    png: PngDir = None,
    svg: SvgDir = None,
    reuse_before: Path = typer.Option(
        None, help="An earlier --json report of the same BEFORE and settings: reuse its BEFORE side."
    ),
    quiet: QuietOutput = False,
    device: Device = defaults.DEVICE,
    dtype: Dtype = defaults.DTYPE,
    offline: Offline = False,
    allow_download: AllowDownload = False,
    allow_pickle: AllowPickle = False,
    trust_remote_code: TrustRemoteCode = False,
    device_map: DeviceMap = None,
    max_memory: MaxMemory = None,
) -> None:
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
    check_outputs(("--json", json_out), ("--html", html_out), overwrite=overwrite)  # before any heavy import
    check_figure_outputs(png, svg)
    probes = [str(parse_probe(p)) for p in probe] if probe else None
    check_inputs(models=[before, after, control], offline=offline)
    from .. import ReportSettings, compare_models_with
    from ..preflight import parse_outlier

    sigmas = floats(sigma, "sigma")
    if not sigmas or any(not s > 0 for s in sigmas):
        raise UsageError(f"--sigma takes positive numbers, e.g. 1,2,4; got {sigma!r}")
    try:
        outliers = tuple(parse_outlier(v.strip()) for v in outlier.split(",") if v.strip())
    except ValueError as err:
        raise UsageError(str(err)) from None
    plan = None
    if lm_eval is not None:
        from .. import LMEvalPlan
        from ..preflight import parse_lm_eval_tasks, require_lm_eval

        require_lm_eval()  # before any model loads
        include = None if lm_eval_include is None else str(lm_eval_include)
        plan = LMEvalPlan(parse_lm_eval_tasks(lm_eval), lm_eval_fewshot, lm_eval_limit, include, batch_size)
    elif lm_eval_fewshot is not None or lm_eval_limit is not None or lm_eval_include is not None:
        raise UsageError("--lm-eval-fewshot, --lm-eval-limit and --lm-eval-include need --lm-eval TASKS")
    # the files as paths: compare_models reads them (before a model loads) and names them in the report
    settings = ReportSettings(
        text_id=text_id, text_ood=text_ood, heldout_of=heldout_of, pairs=pairs,
        pairs_limit=pairs_limit or None, probes=probes, seed=seed, samples=samples, seq_len=seq_len,
        max_tokens=max_tokens, batch_size=batch_size, sigmas=sigmas, outliers=outliers,
        icl_length=icl_length, prompts=prompts, builtin=not no_builtin, lm_eval_plan=plan,
        random_ids=random_ids,
    )  # fmt: skip
    load = load_options(
        device, dtype, allow_download, allow_pickle, trust_remote_code, device_map, max_memory,
        offline=offline,  # no --revision: two models; each takes its own as org/name@REV
    )  # fmt: skip
    with progress("ssacli report", quiet=quiet) as update:
        report = compare_models_with(
            before, after, control, settings, load, progress=update, before_report=reuse_before
        )
    data = report.to_dict()  # what is rendered and written: the JSON document
    console = Console()
    if not quiet:
        from .. import render_quality_report

        render_quality_report(data, console)
    outputs = []
    if json_out is not None:
        outputs.append((json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n", json_out))
    if html_out is not None:
        from .. import quality_report_html

        outputs.append((quality_report_html(data), html_out))
    figures = figure_outputs(lambda: _figures(data), png, svg)
    for text, path in outputs:  # every output rendered before the first is written
        write_output(text, path, console)
    write_figure_outputs(figures, console)


def _figures(data: dict) -> list:
    """The report page's named figures (--png, --svg)."""
    from .. import render_figures

    return render_figures(data)
