"""What every training command shows while it runs and when it ends (convert --finetune, finetune,
train, the conversion recipe): a progress bar on terminals; elsewhere (a log file, CI) a step line
every ``log_every`` steps; and, whatever else is shown, a line at least every HEARTBEAT_S seconds,
``--quiet`` included, so a long run never looks hung (the recipe's distillation once printed nothing
for eight minutes); and the ``--json`` document of a command that writes a model folder
(:func:`run_document`)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from ..files import json_text
from .options import bar_columns, progress
from .outputs import write_output

RUN_SCHEMA = "ssacli-run"  # the --json document of convert, finetune, train and icl train
RUN_SCHEMA_VERSION = 1
HEARTBEAT_S = 30.0  # the longest a running job stays silent on stderr
FINE_TUNING = "fine-tuning"  # what the bar and the step lines of a plain run are called


def is_rank0() -> bool:
    """False on the other processes of a torchrun / accelerate launch (they print nothing)."""
    return int(os.environ.get("RANK", "0")) == 0


@contextmanager
def training_display(
    steps: int, log_every: int, quiet: bool, description: str = FINE_TUNING
) -> Iterator[Callable[..., None]]:
    """The ``on_step(step, loss, lr, tokens_per_s)`` of a training run: a progress bar on terminals,
    a step line every ``log_every`` steps elsewhere, a heartbeat line every HEARTBEAT_S seconds
    without a bar (``quiet`` included). The bar starts at the first step, so what the run prints
    before (the fidelity of a conversion, the model built from scratch) stays above it."""
    from rich.progress import TextColumn, TimeRemainingColumn

    stats = "loss {task.fields[loss]:.4g} · lr {task.fields[lr]:.2e} · {task.fields[tps]:,.0f} tok/s"
    columns = bar_columns(TextColumn(stats), TimeRemainingColumn())
    stderr = Console(stderr=True, quiet=not is_rank0())
    fields = {"total": steps, "loss": float("nan"), "lr": 0.0, "tps": 0.0}
    began = time.monotonic()
    with ExitStack() as stack:
        shown: list = []  # the bar's update function (None: no bar), once the first step is done
        last = [began]  # when the last line was printed

        def on_step(step: int, loss: float, lr: float, tokens_per_s: float) -> None:
            if not shown:
                bar = progress(description, columns, quiet=quiet, transient=False, **fields)
                shown.append(stack.enter_context(bar))
            if shown[0] is not None:
                shown[0](completed=step, loss=loss, lr=lr, tps=tokens_per_s)
                return
            now = time.monotonic()
            logged = not quiet and (step % log_every == 0 or step == steps)
            if logged or now - last[0] >= HEARTBEAT_S:
                left = (now - began) / step * (steps - step)
                stderr.print(
                    f"{description} step {step}/{steps} loss {loss:.4g} lr {lr:.3g} {tokens_per_s:,.0f} "
                    f"tok/s, {_duration(now - began)} so far, ~{_duration(left)} left",
                    highlight=False,
                    soft_wrap=True,
                )
                last[0] = now

        yield on_step


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


def print_trained(out: Path, path: Path | None) -> None:
    """The summary line of every training command: where ``out`` is, from the record in ``path``."""
    from .. import training_record

    if not is_rank0():
        return
    record = (training_record(path) if path is not None else None) or {}
    history, heldout = record.get("history") or [], record.get("heldout") or []
    parts = [f"wrote {out} (step {record.get('step')}"]
    if history:
        parts.append(f"loss {history[0][1]:.4g} → {history[-1][1]:.4g}")
    if len(heldout) > 1:
        parts.append(f"held-out loss {heldout[0][1]:.4g} → {heldout[-1][1]:.4g}")
    parts.append(f"{record.get('seconds')} s, {record.get('tokens_per_s', 0):,.0f} tokens/s)")
    line = ", ".join(parts)
    if record.get("worsened"):
        best = record.get("best")
        kept = (
            f"; the best checkpoint (step {best['step']}, held-out loss {best['heldout_loss']:.4g}) is in "
            f"{Path(out) / best['folder']}"
            if best
            else ""
        )
        line += f" — WORSE: the held-out loss ended above its start{kept}"
    typer.echo(line)


def run_document(
    command: str,
    out: str | Path,
    *,
    fidelity: dict[str, Any] | None = None,
    control: str | Path | None = None,
) -> dict[str, Any]:
    """The ``--json`` document of a command that writes a model folder (convert, finetune, train,
    icl train): the folder and the record ssacli keeps in its ssacli.json (scorer, source, the
    training run with its loss history, held-out losses and tokens/s; a recipe's stages), as
    written; a conversion's ``fidelity`` as it was measured (an ICL folder does not keep it); with
    a recipe's ``control``, that folder and its record too."""
    from .. import folder_record

    def side(folder: str | Path) -> dict[str, Any]:
        folder = Path(folder).expanduser()
        return {"out": str(folder.absolute()), "record": folder_record(folder)}

    document: dict[str, Any] = {
        "schema": RUN_SCHEMA,
        "schema_version": RUN_SCHEMA_VERSION,
        "command": command,
    }
    document |= side(out)
    if fidelity is not None:
        document["fidelity"] = fidelity
    if control is not None:
        document["control"] = side(control)
    return document


def write_run_json(command: str, path: str | Path | None, out: str | Path, **parts: Any) -> None:
    """``--json PATH`` of a folder-writing command (None: not asked for): :func:`run_document`."""
    if path is not None and is_rank0():  # under torchrun, one document: rank 0's (the others write no folder)
        write_output(json_text(run_document(command, out, **parts)), path)
