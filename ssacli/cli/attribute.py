"""`ssacli attribute`: how much of a probe's output damage the attention patterns of chosen heads
carry, by patching the unshifted weights back (``ssacli.attribute_with``; docs/diagnose.md,
"Attribution by attention-pattern patching"). A command of its own rather than a diagnose flag: it
is one API call with its own result and schema, most of diagnose's options (--scorer, --compare,
--generate, --shift, --stats, figures) do not apply to it, and its cost (the null: 200 patched
passes per set by default) should be asked for by name."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from .. import defaults
from ..errors import UsageError
from ..files import json_text
from .options import (
    AllowDownload,
    AllowPickle,
    Device,
    Dtype,
    Model,
    Offline,
    OverwriteFiles,
    QuietOutput,
    Revision,
    TrustRemoteCode,
    check_inputs,
    check_outputs,
    load_options,
    progress,
)
from .outputs import write_output


def attribute_command(
    model_ref: Model,
    probe: str = typer.Option(
        defaults.ATTRIBUTE_PROBE,
        metavar="PROBE",
        help="NAME:LEVELS with the unshifted level (key-scale, logit-scale, dominant-key, embed-scale, "
        "outlier, length), e.g. logit-scale:1,4.",
    ),
    level: float = typer.Option(None, help="The shifted level to attribute (default: the probe's last)."),
    heads: str = typer.Option(
        None,
        metavar="HEADS",
        help="Measure this set on every prompt, e.g. L2H1,L3H0 (default: top --k by collapse rise, "
        "chosen on half the prompts, measured on the other).",
    ),
    k: int = typer.Option(defaults.ATTRIBUTE_K, "--k", min=1, help="Heads per chosen set."),
    null: int = typer.Option(
        defaults.ATTRIBUTE_NULL, min=0, help="Random layer-matched sets per set (0: no null; the cost)."
    ),
    no_per_head: bool = typer.Option(False, "--no-per-head", help="Do not patch each head of a set alone."),
    no_ceiling: bool = typer.Option(False, "--no-ceiling", help="Do not patch every head (the ceiling)."),
    resamples: int = typer.Option(
        None, min=1, help="Bootstrap resamples of each interval (default: ssacli.stats', 10,000)."
    ),
    remedy: str = typer.Option(
        None,
        metavar="T1,T2,…",
        help="Also temper each set's heads at these temperatures (the remedy, not attribution; "
        "refused under logit-scale, which T undoes exactly).",
    ),
    text: Path = typer.Option(None, help="UTF-8 text file to probe with (default: built-in texts)."),
    random_ids: bool = typer.Option(
        False, "--random", help="Probe with random token ids (not under length)."
    ),
    samples: int = typer.Option(defaults.ATTRIBUTE_SAMPLES, min=1, help="Prompts (two halves)."),
    length: int = typer.Option(None, min=2, help=f"Base length in tokens; default {defaults.PROBE_LENGTH}."),
    batch_size: int = typer.Option(defaults.BATCH_SIZE, min=1, help="Sequences per forward pass."),
    seed: int = typer.Option(defaults.SEED, help="Seed of the inputs, the null and the bootstrap."),
    tau: float = typer.Option(defaults.TAU, help="A row has collapsed when its largest weight is >= tau."),
    device: Device = defaults.DEVICE,
    dtype: Dtype = defaults.DTYPE,
    offline: Offline = False,
    revision: Revision = None,
    allow_download: AllowDownload = False,
    allow_pickle: AllowPickle = False,
    trust_remote_code: TrustRemoteCode = False,
    json_out: Path = typer.Option(
        None, "--json", help="Write the result (schema ssacli-attribution) to this file; - for stdout."
    ),
    html_out: Path = typer.Option(None, "--html", help="Write a self-contained HTML page to this file."),
    overwrite: OverwriteFiles = False,
    quiet: QuietOutput = False,
) -> None:
    r"""Attribute a probe's output damage to heads by patching their unshifted attention patterns.

    Causal LMs only. Examples:

      ssacli attribute builtin:wikitext-softmax --probe key-scale:1,8

      ssacli attribute ./my-lm --probe logit-scale:1,4 --heads L2H1,L3H0 \
          --null 0 --json attribution.json
    """
    check_outputs(("--json", json_out), ("--html", html_out), overwrite=overwrite)  # before any heavy import
    from .. import AttributionSettings  # torch-free, as the preflight checks
    from ..preflight import check_attribution_probe, parse_heads, read_text_file

    settings = AttributionSettings(
        level=level, heads=None if heads is None else tuple(parse_heads(heads)), k=k, null=null,
        per_head=not no_per_head, ceiling=not no_ceiling, remedy=_temperatures(remedy),
        **({} if resamples is None else {"resamples": resamples}),
    )  # fmt: skip
    parsed, _ = check_attribution_probe(probe, level, settings.remedy)  # torch-free: refused here
    check_inputs(models=[model_ref], offline=offline, revision=revision)
    prompts_text = read_text_file(text) if text else None  # a missing or empty file: exit 4, torch-free
    from .. import DiagnoseSettings  # imports torch: after every check the command line decides

    inputs = DiagnoseSettings(
        text=prompts_text, random_ids=random_ids, samples=samples, length=length,
        batch_size=batch_size, seed=seed, tau=tau, stats="eager",
    )  # fmt: skip
    load = load_options(
        device, dtype, allow_download, allow_pickle, trust_remote_code, None, None, offline=offline,
        revision=revision,
    )  # fmt: skip
    from .. import attribute_with

    with progress(f"{model_ref}: patching attention under {probe}", quiet=quiet):
        result = attribute_with(model_ref, parsed, settings, inputs, load)
    console = Console()
    if not quiet:
        shown = result.settings
        console.print(
            f"{result.model}: {len(result.damage)} prompts × {shown['length']} tokens, "
            f"{result.elapsed_s:.1f} s",
            highlight=False,
        )
        for line in result.lines():
            console.print(line, highlight=False, soft_wrap=True)
    outputs = []  # every output rendered before the first is written
    if json_out is not None:
        outputs.append((json_text(result.to_dict()), json_out))
    if html_out is not None:
        from .. import attribution_html

        outputs.append((attribution_html(result), html_out))
    for content, path in outputs:
        write_output(content, path, console)


def _temperatures(text: str | None) -> tuple[float, ...]:
    """``--remedy 2,4,8`` as (2.0, 4.0, 8.0); anything else one line (exit 2)."""
    if text is None:
        return ()
    try:
        return tuple(float(t) for t in text.split(","))
    except ValueError:
        raise UsageError(
            f"--remedy '{text}' is not a list of temperatures; give e.g. --remedy 2,4,8"
        ) from None
