"""``ssacli convert MODEL --scorer ssa --finetune --data TEXT``: the conversion recipe's options and
its display (:mod:`ssacli.train.recipe` is the recipe)."""

from __future__ import annotations

import time
from collections import deque
from contextlib import ExitStack
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from rich.console import Console

from .. import LoadOptions
from .. import defaults as D
from ..errors import UsageError
from ..preflight import local_model_path
from ..setting import setting
from .training import training_display

AUTO = "auto"  # --stages not given: the recipe for SSA on a causal LM's text, else one fine-tune
STAGE_CHOICES = f"{AUTO}, lm, or a comma list of transfer, distill"


@dataclass(frozen=True)
class RecipeOptions:
    """``convert --finetune``'s recipe options as the command line gives them (None: not given):
    ``stages`` and ``control`` choose what runs, the others are :class:`ssacli.RecipeConfig` fields of
    the same names (tests/cli/test_declared.py checks), each refused unless the recipe runs."""

    stages: str | None = setting(
        None,
        f"With --finetune: {STAGE_CHOICES}. {AUTO}: the recipe for SSA on a causal LM's text "
        f"({','.join(D.RECIPE_STAGES)}; transfer,distill when --transfer-steps is given), else lm (one "
        f"fine-tune) (default {AUTO}).",
        type=str,
    )
    target_n: float | None = setting(
        None, f"Recipe: the n every layer ends at (default {D.RECIPE_TARGET_N:g}).", type=float
    )
    b: str | None = setting(
        None,
        f"Recipe: b learned (rescaled with n, then trained) or tied (1/n) (default {D.RECIPE_B}).",
        flags=("--recipe-b",),
        type=str,
    )
    transfer_steps: int | None = setting(
        None,
        f"Recipe: run the attention-transfer stage first, this many steps (default: no transfer "
        f"stage; with --stages transfer,distill {D.RECIPE_TRANSFER_STEPS}).",
        type=int,
        min=1,
    )
    distill_steps: int | None = setting(
        None, f"Recipe: distillation steps (default {D.RECIPE_DISTILL_STEPS}).", type=int, min=1
    )
    lora_rank: int | None = setting(
        None, f"Recipe: LoRA rank of the distillation (default {D.RECIPE_LORA_RANK}).", type=int, min=1
    )
    lm_weight: float | None = setting(
        None, f"Recipe: weight of the LM loss beside the KL (default {D.RECIPE_LM_WEIGHT:g}).", type=float
    )
    max_loss: float | None = setting(
        None,
        f"Recipe: how far (nats/token) the held-out loss may end above the original's; the KL to the "
        f"original is reported as fidelity (default {D.RECIPE_MAX_LOSS:g}).",
        type=float,
    )
    control: Path | None = setting(
        None,
        "Recipe: also train the softmax control there (the same LoRA rank, data, steps, seed and "
        "objective, no SSA) and read quality against it; a folder holding that control is reused.",
        type=Path,
    )

    def given(self) -> dict[str, Any]:
        """The RecipeConfig settings given (``stages`` and ``control`` aside), by name."""
        names = [f.name for f in fields(self) if f.name not in ("stages", "control")]
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}


def wants_recipe(stages: str | None, scorer: str, data: str | None) -> bool:
    """Whether ``--stages`` (None: auto) asks for the recipe rather than one fine-tune."""
    if stages in (None, AUTO):
        from .. import parse_spec  # torch-free: the recipe's options are refused before the model stack

        return parse_spec(scorer)[0] == "ssa" and bool(data) and not data.startswith("icl:")
    return stages != "lm"


def recipe_config(stages: str | None, scorer: str, options: dict[str, Any], recipe: dict[str, Any]):
    """The RecipeConfig of the call; refuses plain fine-tuning options the recipe does not take."""
    from .. import parse_spec

    plain_only = ("steps", "monitor_every", "grad_accum", "warmup", "schedule", "weight_decay", "train",
                  "anneal_n", "log_every", "attention")  # fmt: skip
    for name in plain_only:
        if name in options:
            raise UsageError(
                f"--{name.replace('_', '-')} applies to one fine-tune (--stages lm); the recipe takes "
                "--transfer-steps, --distill-steps and --target-n"
            )
    _, given = parse_spec(scorer)  # the options the spec sets, parsed as the scorer takes them
    if given.keys() - {"n"}:
        raise UsageError(
            f"the recipe starts from ssa:init=faithful and moves n to --target-n; give --scorer ssa "
            f"(or ssa:n=N for the target), not {scorer}, or use --stages lm"
        )
    if "n" in given:
        recipe.setdefault("target_n", given["n"])
    if stages not in (None, AUTO):
        recipe["stages"] = tuple(s.strip() for s in stages.split(",") if s.strip())
    shared = ("data", "lr", "scorer_lr", "batch_size", "seq_len", "seed", "checkpoint_every")
    settings = {k: options[k] for k in shared if k in options}
    from .. import RecipeConfig  # torch: after the checks the command line alone decides

    config = RecipeConfig(**settings, **recipe)
    config.validate()
    return config


class _StageDisplay:
    """The recipe's ``on_step``: :func:`~ssacli.cli.training.training_display` for each stage in
    turn (a bar on terminals; step lines and the 30-second heartbeat elsewhere, --quiet included)."""

    def __init__(self, quiet: bool, tokens_per_step: int) -> None:
        self.quiet, self.tokens_per_step = quiet, tokens_per_step
        self.stage: str | None = None
        self.stack = ExitStack()

    def __call__(self, stage: str, step: int, steps: int, loss: float, lr: float) -> None:
        if stage != self.stage:
            self.stack.close()
            self.stage, self.ends = stage, deque(maxlen=21)  # the last steps' end times: the rate
            self.update = self.stack.enter_context(
                training_display(steps, max(1, steps // 20), self.quiet, description=stage)
            )
        self.ends.append(time.perf_counter())
        span = self.ends[-1] - self.ends[0]
        rate = self.tokens_per_step * (len(self.ends) - 1) / span if span > 0 else 0.0
        self.update(step, loss, lr, rate)

    def close(self) -> None:
        self.stack.close()


def run_recipe(model_ref: str, out: Path, config, *, overwrite: bool, resume: bool, text: str | None,
               quiet: bool, show_fidelity, load: LoadOptions, strict: bool = False,
               control: Path | None = None) -> None:  # fmt: skip
    """The recipe from the command line: the SSA arm into ``out``, then (``control``) the softmax
    control, trained or reused; the last line reads quality against the original and the control."""
    from ..preflight import reusable_control  # torch-free: --control is checked before the model stack

    if load.dtype not in ("auto", "float32"):
        raise UsageError("the recipe trains in float32; leave --dtype at auto")
    reused = None  # the control's record, once trained or found
    if control is not None:  # checked before any work: a folder holding anything else is refused
        control = control.expanduser()
        source = str(local_model_path(model_ref) or model_ref)
        reused = reusable_control(control, config.recorded(), source)
        if reused is None and config.lm_weight <= 0:
            raise UsageError("--control needs --lm-weight > 0 (KL alone gives a softmax control no gradient)")
    from .. import convert_with_recipe, softmax_control

    stderr = Console(stderr=True, quiet=quiet)

    def on_eval(entry: dict[str, Any]) -> None:
        n = entry.get("n") or []
        kl, ppl = entry.get("kl"), entry.get("heldout_ppl")
        original = entry.get("original_ppl")
        measured = "" if kl is None else f" · KL {kl:.4f} · ppl {ppl:.2f} (original {original:.2f})"
        scorer = f"n max {max(n):.3g}" if n else "softmax"
        stderr.print(f"{entry['stage']} step {entry['step']}: {scorer}{measured}", highlight=False)

    keywords = {k: v for k, v in load.keywords().items() if k != "dtype"}  # the recipe's own: float32
    console = Console()
    display = _StageDisplay(quiet, config.batch_size * config.seq_len)
    try:
        _, record = convert_with_recipe(
            model_ref, out, config, overwrite=overwrite, resume=resume, text=text, on_eval=on_eval,
            on_step=display, strict=strict, **keywords,
        )  # fmt: skip
        if control is not None and reused is None:
            display.close()
            stderr.print(f"softmax control: the same budget without SSA, into {control}", highlight=False)
            _, reused = softmax_control(
                model_ref, control, config, resume=resume, on_eval=on_eval, on_step=display, **keywords
            )  # fmt: skip
    finally:
        display.close()
    for line in recipe_lines(out, record, control, reused, config.max_loss):
        console.print(line, highlight=False, soft_wrap=True)


def recipe_lines(
    out: Path,
    record: dict[str, Any],
    control: Path | None,
    control_record: dict[str, Any] | None,
    max_loss: float,
) -> list[str]:
    """What a recipe run ends with: where it wrote, n, quality against the original and (with a
    control) against the softmax control, on how many held-out tokens, the KL as fidelity."""
    final = record["final"]
    if final["kl"] is None:
        return [f"wrote {out}: n max {final['n_max']:.3g}; no held-out text to measure quality on"]
    tokens = (record.get("heldout") or {}).get("tokens")
    versus = f"{100 * (final['ppl_ratio'] - 1):+.1f} % vs the original ({final['original_ppl']:.2f})"
    if control_record is not None:
        ppl = control_record["final"]["heldout_ppl"]
        versus += (
            f", {100 * (final['heldout_ppl'] / ppl - 1):+.1f} % vs softmax with the same budget ({ppl:.2f}, "
            f"{control})"
        )
    verdict = "met" if final["met_max_loss"] else "MISSED"
    lines = [
        f"wrote {out}: n max {final['n_max']:.3g}; held-out ppl {final['heldout_ppl']:.2f} on {tokens:,} "
        f"tokens: {versus}; KL to the original {final['kl']:.4f} nats/token (fidelity); loss "
        f"{final['loss_change']:+.4f} nats/token vs the original: {verdict} --max-loss {max_loss:g}"
    ]
    heldout = record.get("heldout") or {}
    if tokens is not None and tokens < heldout.get("asked", 0):
        lines.append(
            f"note: measured on {tokens:,} held-out tokens, fewer than the {heldout['asked']:,} asked: the "
            f"held-out slice of --data (its last tenth) holds {heldout.get('available', tokens):,}"
        )
    return lines
