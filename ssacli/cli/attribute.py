"""`ssacli attribute`: how much of a probe's output damage the attention patterns of chosen heads
carry, by patching the unshifted weights back (``ssacli.attribute_with``; docs/diagnose.md,
"Attribution by attention-pattern patching"). A command of its own rather than a diagnose flag: it
is one API call with its own result and schema, most of diagnose's options (--scorer, --compare,
--generate, --shift, --stats, figures) do not apply to it, and its cost (the null: 200 patched
passes per set by default) should be asked for by name."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from .. import AttributionSettings, DiagnoseSettings, LoadOptions, defaults
from ..errors import UsageError
from ..files import json_text
from ..setting import setting
from .declared import Given, command, options
from .options import Model, check_inputs, check_outputs, output_file, overwrite_files, progress, quiet_output
from .outputs import write_output


@dataclass(frozen=True)
class AttributeOptions:
    """attribute's options that only the command line has: the probe (the API's argument), the
    switches that turn parts of the measure off, the files written and what the terminal shows."""

    probe: str = setting(
        defaults.ATTRIBUTE_PROBE,
        "NAME:LEVELS with the unshifted level (key-scale, logit-scale, dominant-key, embed-scale, "
        "outlier, length), e.g. logit-scale:1,4.",
        metavar="PROBE",
    )
    no_per_head: bool = setting(False, "Do not patch each head of a set alone.")
    no_ceiling: bool = setting(False, "Do not patch every head (the ceiling).")
    json_out: Path | None = output_file(
        "--json", "Write the result (schema ssacli-attribution) to this file; - for stdout."
    )
    html_out: Path | None = output_file("--html", "Write a self-contained HTML page to this file.")
    overwrite: bool = overwrite_files()
    quiet: bool = quiet_output()


PROMPTS = ("text", "random_ids", "samples", "length", "batch_size", "seed", "tau")  # diagnose's
ATTRIBUTE_OPTIONS = (
    options(AttributeOptions, "probe"),
    options(AttributionSettings, "level", "heads", "k", "null"),
    options(AttributeOptions, "no_per_head", "no_ceiling"),
    options(AttributionSettings, "resamples", "remedy"),
    options(
        DiagnoseSettings,
        *PROMPTS,
        random_ids={"help": "Probe with random token ids (not under length)."},
        samples={"default": defaults.ATTRIBUTE_SAMPLES, "help": "Prompts (two halves)."},
        length={"help": f"Base length in tokens; default {defaults.PROBE_LENGTH}."},
        seed={"help": "Seed of the inputs, the null and the bootstrap."},
    ),  # fmt: skip
    options(LoadOptions, exclude=("device_map", "max_memory")),
    options(AttributeOptions, "json_out", "html_out", "overwrite", "quiet"),
)


@command(*ATTRIBUTE_OPTIONS)
def attribute_command(model_ref: Model, *, given: Given) -> None:
    r"""Attribute a probe's output damage to heads by patching their unshifted attention patterns.

    Causal LMs only. Examples:

      ssacli attribute builtin:wikitext-softmax --probe key-scale:1,8

      ssacli attribute ./my-lm --probe logit-scale:1,4 --heads L2H1,L3H0 \
          --null 0 --json attribution.json
    """
    out = given.of(AttributeOptions)
    check_outputs(("--json", out.json_out), ("--html", out.html_out), overwrite=out.overwrite)  # first
    from ..preflight import (  # torch-free
        check_attribution_model,
        check_attribution_probe,
        check_attribution_prompts,
        parse_heads,
        read_text_file,
    )

    heads = None if given.heads is None else tuple(parse_heads(given.heads))
    settings = given.of(
        AttributionSettings, heads=heads, per_head=not out.no_per_head, ceiling=not out.no_ceiling,
        remedy=_temperatures(given.remedy),
    )  # fmt: skip
    parsed, _ = check_attribution_probe(out.probe, given.level, settings.remedy)  # torch-free: refused here
    check_attribution_prompts(parsed.kind, False, given.random_ids)
    check_inputs(models=[model_ref], offline=given.offline, revision=given.revision, device=given.device,
                 allow_pickle=given.allow_pickle, dtype=given.dtype)  # fmt: skip
    check_attribution_model(model_ref, settings)  # its folder's kind, layers and heads
    text = read_text_file(given.text) if given.text else None  # a missing or empty file: exit 4, torch-free
    inputs = given.of(DiagnoseSettings, text=text, stats="eager")  # imports torch: after every check
    from .. import attribute_with

    with progress(f"{model_ref}: patching attention under {out.probe}", quiet=out.quiet):
        result = attribute_with(model_ref, parsed, settings, inputs, given.of(LoadOptions))
    _report(result, out)


def _report(result, out: AttributeOptions) -> None:
    """The model's line and the result's lines (unless --quiet), then the files: every output is
    rendered before the first is written."""
    console = Console()
    if not out.quiet:
        shown = result.settings
        console.print(
            f"{result.model}: {len(result.damage)} prompts × {shown['length']} tokens, "
            f"{result.elapsed_s:.1f} s",
            highlight=False,
        )
        for line in result.lines():
            console.print(line, highlight=False, soft_wrap=True)
    outputs = []
    if out.json_out is not None:
        outputs.append((json_text(result.to_dict()), out.json_out))
    if out.html_out is not None:
        from .. import attribution_html

        outputs.append((attribution_html(result), out.html_out))
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
