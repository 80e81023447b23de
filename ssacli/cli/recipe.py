"""``ssacli convert MODEL --scorer ssa --finetune --data TEXT``: the conversion recipe's options and
its display (:mod:`ssacli.train.recipe` is the recipe)."""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from .. import defaults as D
from ..errors import UsageError
from ..models.options import LoadOptions
from .training import training_display

AUTO = "auto"  # --stages not given: the recipe for SSA on a causal LM's text, else one fine-tune
STAGE_CHOICES = f"{AUTO}, lm, or a comma list of transfer, distill"
Stages = Annotated[
    str,
    typer.Option(
        help=f"With --finetune: {STAGE_CHOICES}. {AUTO}: the recipe (transfer,distill) for SSA on a causal "
        f"LM's text, else lm (one fine-tune) (default {AUTO}).",
    ),
]
TargetN = Annotated[
    float, typer.Option(help=f"Recipe: the n every layer ends at (default {D.RECIPE_TARGET_N:g}).")
]
RecipeB = Annotated[
    str,
    typer.Option(
        help=f"Recipe: b learned (rescaled with n, then trained) or tied (1/n) (default {D.RECIPE_B})."
    ),
]
TransferSteps = Annotated[
    int, typer.Option(min=1, help=f"Recipe: attention-transfer steps (default {D.RECIPE_TRANSFER_STEPS}).")
]
DistillSteps = Annotated[
    int, typer.Option(min=1, help=f"Recipe: distillation steps (default {D.RECIPE_DISTILL_STEPS}).")
]
LoraRank = Annotated[
    int, typer.Option(min=1, help=f"Recipe: LoRA rank of the distillation (default {D.RECIPE_LORA_RANK}).")
]
LmWeight = Annotated[
    float, typer.Option(help=f"Recipe: weight of the LM loss beside the KL (default {D.RECIPE_LM_WEIGHT:g}).")
]
MaxKl = Annotated[
    float, typer.Option(help=f"Recipe: the KL budget (nats/token) to meet (default {D.RECIPE_MAX_KL:g}).")
]


def wants_recipe(stages: str | None, scorer: str, data: str | None) -> bool:
    """Whether ``--stages`` (None: auto) asks for the recipe rather than one fine-tune."""
    if stages in (None, AUTO):
        from ..scorers import make_scorer

        return make_scorer(scorer).name == "ssa" and bool(data) and not data.startswith("icl:")
    return stages != "lm"


def recipe_config(stages: str | None, scorer: str, options: dict[str, Any], recipe: dict[str, Any]):
    """The RecipeConfig of the call; refuses plain fine-tuning options the recipe does not take."""
    from ..scorers import make_scorer
    from ..train.recipe import RecipeConfig

    plain_only = ("steps", "monitor_every", "grad_accum", "warmup", "schedule", "weight_decay", "train",
                  "anneal_n", "log_every", "attention")  # fmt: skip
    for name in plain_only:
        if name in options:
            raise UsageError(
                f"--{name.replace('_', '-')} applies to one fine-tune (--stages lm); the recipe takes "
                "--transfer-steps, --distill-steps and --target-n"
            )
    spec = make_scorer(scorer)
    if spec.given.keys() - {"n"}:
        raise UsageError(
            f"the recipe starts from ssa:init=faithful and moves n to --target-n; give --scorer ssa "
            f"(or ssa:n=N for the target), not {scorer}, or use --stages lm"
        )
    if "n" in spec.given:
        recipe.setdefault("target_n", spec.opts["n"])
    if stages not in (None, AUTO):
        recipe["stages"] = tuple(s.strip() for s in stages.split(",") if s.strip())
    shared = ("data", "lr", "scorer_lr", "batch_size", "seq_len", "seed", "checkpoint_every")
    settings = {k: options[k] for k in shared if k in options}
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
            self.stage, self.began, self.first = stage, time.perf_counter(), step - 1
            self.update = self.stack.enter_context(
                training_display(steps, max(1, steps // 20), self.quiet, description=stage)
            )
        done = step - self.first
        self.update(step, loss, lr, self.tokens_per_step * done / max(time.perf_counter() - self.began, 1e-9))

    def close(self) -> None:
        self.stack.close()


def run_recipe(model_ref: str, out: Path, config, *, overwrite: bool, resume: bool, text: str | None,
               quiet: bool, show_fidelity, load: LoadOptions, strict: bool = False) -> None:  # fmt: skip
    from ..train.recipe import convert_with_recipe

    stderr = Console(stderr=True, quiet=quiet)

    def on_eval(entry: dict[str, Any]) -> None:
        n = entry.get("n") or []
        kl, ppl = entry.get("kl"), entry.get("heldout_ppl")
        original = entry.get("original_ppl")
        measured = "" if kl is None else f" · KL {kl:.4f} · ppl {ppl:.2f} (original {original:.2f})"
        stderr.print(f"{entry['stage']} step {entry['step']}: n max {max(n):.3g}{measured}", highlight=False)

    if load.dtype not in ("auto", "float32"):
        raise UsageError("the recipe trains in float32; leave --dtype at auto")
    keywords = {k: v for k, v in load.keywords().items() if k != "dtype"}  # the recipe's own: float32
    display = _StageDisplay(quiet, config.batch_size * config.seq_len)
    try:
        _, record = convert_with_recipe(
            model_ref, out, config, overwrite=overwrite, resume=resume, text=text, on_eval=on_eval,
            on_step=display, strict=strict, **keywords,
        )  # fmt: skip
    finally:
        display.close()
    final = record["final"]
    console = Console()
    if final["kl"] is None:
        console.print(f"wrote {out}: n max {final['n_max']:.3g}; no held-out text to measure KL on")
        return
    verdict = "met" if final["met_max_kl"] else "MISSED"
    console.print(
        f"wrote {out}: n max {final['n_max']:.3g}, KL {final['kl']:.4f} nats/token ({verdict} the budget "
        f"{config.max_kl:g}), held-out ppl {final['heldout_ppl']:.2f} vs the original's "
        f"{final['original_ppl']:.2f} ({100 * (final['ppl_ratio'] - 1):+.1f} %)",
        highlight=False,
        soft_wrap=True,
    )
