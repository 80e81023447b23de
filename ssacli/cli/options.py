"""What the commands share: the options several commands have, option-value parsers, the help
pages, the progress display and the one-line error report.

A command's options are the fields of settings values (ssacli/cli/declared.py): the API's own
(DiagnoseSettings, LoadOptions, …) and, for what only the command line has, a frozen dataclass of
the command's module. The fields several commands share are made here (:func:`overwrite_files`,
:func:`figure_folder`, …), as are the fine-tuning options of ``convert --finetune`` and ``finetune``
(:class:`FinetuneOptions`), which default to None on purpose (see cli/convert.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

from .. import defaults as D
from .. import parse_spec
from ..errors import SsacliError, UsageError
from ..files import check_writable
from ..preflight import (
    DATA_FORMS,
    check_device,
    check_dtype,
    check_model_reference,
    check_placement,
    fetch_model_reference,
)
from ..setting import setting
from .outputs import STDOUT_OPTIONS, is_stdout, stdout_for_data

# {builtins}: the bundled models, as installed, filled in when help is shown (ModelCommand)
MODEL_HELP = r"HF folder, builtin:NAME ({builtins}), or Hub id org/name\[@REV]."  # \[: not rich markup
DATA_HELP = f"Training data: {DATA_FORMS}."
Model = Annotated[str, typer.Argument(metavar="MODEL", help=MODEL_HELP)]
OptionalModel = Annotated[str, typer.Argument(metavar="MODEL", help=MODEL_HELP)]  # usage adds the [ ]

ICL_SIGMAS_TEXT, ICL_OUTLIERS_TEXT = D.ICL_SIGMAS_TEXT, D.ICL_OUTLIERS_TEXT  # report, icl eval
HEATMAP_HELP = r"Heatmap METRIC\[@PROBE], e.g. collapse_rate@outlier."  # diagnose, render
FINDINGS_HELP = (
    f"Findings the terminal lists, N or all (default {D.FINDINGS}); the rest are counted on a last "
    "line. JSON and HTML hold all."
)  # diagnose, render


def findings_budget(text: str | None) -> int | None:
    """--findings as render() takes it: None for "all", else a count of 0 or more (default FINDINGS)."""
    if text is None:
        return D.FINDINGS
    if text.strip().lower() == "all":
        return None
    try:
        count = int(text)
    except ValueError:
        count = -1
    if count < 0:
        raise UsageError(f"--findings '{text}': give all or a count of 0 or more, e.g. --findings all")
    return count


# ---- output -------------------------------------------------------------------------------------

QUIET_OUTPUT_HELP = "Print nothing but errors and written files."
FIGURES_HELP = "Write the report's figures as {} files into DIR (replacing only ssacli's own)."
OVERWRITE_FILES_HELP = "Replace output files (--json, --html, …) even where ssacli did not write them."


def quiet_output() -> Any:
    """--quiet / -q of a command that reports (diagnose, attribute, render, report)."""
    return setting(False, QUIET_OUTPUT_HELP, flags=("--quiet", "-q"))


def overwrite_files() -> Any:
    """--overwrite of a command that writes output files."""
    return setting(False, OVERWRITE_FILES_HELP, flags=("--overwrite",))


def figure_folder(kind: str) -> Any:
    """--png DIR or --svg DIR (``kind``): the report's figures as files."""
    return setting(None, FIGURES_HELP.format(kind), flags=(f"--{kind.lower()}",), type=Path, metavar="DIR")


def findings_shown() -> Any:
    """--findings all|N (diagnose, render): how many findings the terminal lists."""
    return setting(None, FINDINGS_HELP, flags=("--findings",), type=str, metavar="all|N")


def output_file(option: str, help: str) -> Any:  # noqa: A002
    """An output file option (``--json``, ``--html``, …; None: not written)."""
    return setting(None, help, flags=(option,), type=Path)


RUN_JSON_HELP = "Write the folder's record (its ssacli.json: fidelity, training) as JSON; - for stdout."


def run_json() -> Any:
    """--json of a command that writes a model folder (convert, finetune, train, icl train)."""
    return output_file("--json", RUN_JSON_HELP)


def quiet_training() -> Any:
    """--quiet / -q of a training command."""
    return setting(False, "No progress bar or step log.", flags=("--quiet", "-q"))


# ---- fine-tuning (convert --finetune, finetune): None = not given ------------------------------------

SCORER_LR_HELP = (
    f"Learning rate of the scorer's parameters (b, n, ...): their own AdamW group, no weight decay "
    f"(default {D.SCORER_LR:g}; why: docs/convert.md)."
)
# the warmup FinetuneConfig.warmup_steps takes when none is given
WARMUP_RULE = f"{100 / D.WARMUP_DIVISOR:g}% of --steps, at most {D.WARMUP_MAX}"
ATTENTION_HELP = "Attention kernels: auto (fused where no weights are needed), eager, fused"


@dataclass(frozen=True)
class FinetuneOptions:
    """The fine-tuning settings of ``convert --finetune`` and ``finetune`` as the command line gives
    them: None is not given, so ``convert`` refuses them without ``--finetune`` and ``finetune``
    takes what is not given from the run recorded in the folder it resumes
    (:func:`ssacli.finetune_config`). Each field is a :class:`ssacli.FinetuneConfig` field of the
    same name, whose default its help names (tests/cli/test_declared.py checks both)."""

    data: str | None = setting(None, DATA_HELP, type=str)
    steps: int | None = setting(None, f"Optimizer steps (default {D.FINETUNE_STEPS}).", type=int, min=1)
    lr: float | None = setting(None, f"Peak AdamW learning rate (default {D.FINETUNE_LR:g}).", type=float)
    scorer_lr: float | None = setting(None, SCORER_LR_HELP, type=float)
    monitor_every: int | None = setting(
        None, "Measure attention saturation every N steps into the run's record (0: off).", type=int, min=0
    )
    batch_size: int | None = setting(
        None, f"Sequences per micro-batch, ICL: prompts (default {D.TRAIN_BATCH_SIZE}).", type=int, min=1
    )
    seq_len: int | None = setting(
        None, f"Tokens per training window, text data only (default {D.LM_SEQ_LEN}).", type=int, min=2
    )
    grad_accum: int | None = setting(
        None, f"Micro-batches per step (default {D.GRAD_ACCUM}).", type=int, min=1
    )
    warmup: int | None = setting(None, f"Linear warmup steps (default {WARMUP_RULE}).", type=int, min=0)
    schedule: str | None = setting(
        None,
        f"After warmup: cosine (to {100 * D.MIN_LR_RATIO:g}% of --lr) or constant (default {D.SCHEDULE}).",
        type=str,
    )
    weight_decay: float | None = setting(
        None, f"AdamW weight decay, on matrices only (default {D.WEIGHT_DECAY:g}).", type=float, min=0
    )
    seed: int | None = setting(None, f"Seed of the batches and dropout (default {D.SEED}).", type=int)
    train: str | None = setting(
        None, f"all, or scorer: only the scorer's parameters (default {D.TRAIN_WHAT}).", type=str
    )
    anneal_n: float | None = setting(
        None, "SSA: move n linearly to this value over the run (b = 1/n).", type=float
    )
    checkpoint_every: int | None = setting(
        None, f"Write a checkpoint every K steps (default {D.CHECKPOINT_EVERY}).", type=int, min=1
    )
    log_every: int | None = setting(
        None, f"Record the loss every K steps (default {D.LOG_EVERY}).", type=int, min=1
    )
    attention: str | None = setting(None, f"{ATTENTION_HELP} (default {D.ATTENTION}).", type=str)

    def given(self) -> dict[str, Any]:
        """The settings given, by name (the keywords of :func:`ssacli.finetune_config`)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


# ---- help pages that read at 80 columns --------------------------------------------------------------

# What an option's value is, in the help's type column: short, so the help text gets the width.
VALUE_NAMES = {"int": "N", "float": "X", "str": "TEXT", "path": "PATH"}


@contextmanager
def readable_help(command, ctx) -> Iterator[None]:
    """While typer renders ``command``'s help (a click command or group): a help page that reads at
    80 columns. Typer's rich help prints every option's type, flags included (``--quiet <bool>``),
    and ranges as ``<int range> [x>=1]``, which left ~30 columns for the text: flags get no type,
    values a short name with their range (N, N≥1, X, TEXT, PATH); the bounds that typer would print
    again are hidden from it while it renders (they still validate: restored after). The prose keeps
    the docstring's line breaks, which wrap raggedly on a narrower terminal: a paragraph's lines are
    joined, except in indented paragraphs (examples: verbatim, so no command is broken mid-way;
    each is written to fit 78 columns, a long one continued after a backslash)."""
    hidden = []
    for param in command.get_params(ctx):
        if getattr(param, "param_type_name", "") != "option":
            continue
        if param.metavar is None and getattr(param, "is_flag", False):
            param.metavar = ""
        elif param.metavar is None and hasattr(param, "bare_type"):
            bare = param.bare_type().lower()
            name = VALUE_NAMES.get("path" if "path" in bare else bare.removeprefix("list[").rstrip("]"))
            if name is not None:
                param.metavar = name + _bounds(getattr(param, "min", None), getattr(param, "max", None))
        if getattr(param, "min", None) is not None or getattr(param, "max", None) is not None:
            hidden.append((param, param.min, param.max))
            param.min = param.max = None
    if command.help and not getattr(command, "help_prepared", False):  # once: help can be shown twice
        paragraphs = inspect.cleandoc(command.help).split("\n\n")
        command.help = "\n\n".join(
            "\n".join(map(_verbatim, p.split("\n"))) if p.startswith(" ") else " ".join(p.split())
            for p in paragraphs
        )
        command.help_prepared = True
    try:
        yield
    finally:
        for param, low, high in hidden:
            param.min, param.max = low, high


def _bounds(low, high) -> str:
    """A range as the type column shows it: "≥1", "≤8", "0–1", "" for none."""
    if low is not None and high is not None:
        return f"{low:g}–{high:g}"
    return f"≥{low:g}" if low is not None else f"≤{high:g}" if high is not None else ""


def _verbatim(line: str) -> str:
    """An example line as typer's rich help prints it as written: escaped (a trailing ``\\`` or a
    ``[`` is text, not markup), not dim like the prose around it, and starting with markup, so
    typer's dedent of the help text keeps its indentation."""
    return f"[not dim]{escape(line)}[/not dim]" if line.strip() else line


class HelpCommand(TyperCommand):
    """Every ssacli command: its help reads at 80 columns (:func:`readable_help`); given an output
    as ``-`` it writes that document alone to stdout, everything else to stderr
    (:func:`ssacli.cli.outputs.stdout_for_data`), so no command has to choose its streams."""

    def format_help(self, ctx, formatter) -> None:
        with readable_help(self, ctx):
            super().format_help(ctx, formatter)

    def invoke(self, ctx):
        names = {p.name for p in self.params if set(getattr(p, "opts", ())) & set(STDOUT_OPTIONS)}
        with stdout_for_data(any(is_stdout(ctx.params.get(name)) for name in names)):
            return super().invoke(ctx)


class HelpGroup(TyperGroup):
    """Every ssacli command group (the root, ``icl``): help as :class:`HelpCommand`'s."""

    def format_help(self, ctx, formatter) -> None:
        with readable_help(self, ctx):
            super().format_help(ctx, formatter)


class ModelCommand(HelpCommand):
    """A command with a MODEL argument: its help lists the installed builtin names. They are read
    when help is shown, not at import: finding them imports the model stack (ssacli.models.loading),
    which a command that fails on its options must not wait for."""

    def format_help(self, ctx, formatter) -> None:
        from ..preflight import builtin_model_names  # torch-free: --help stays fast

        for param in self.params:
            if param.help is not None and "{builtins}" in param.help:
                param.help = param.help.format(builtins=", ".join(builtin_model_names()))
        super().format_help(ctx, formatter)


def given(**options: Any) -> dict[str, Any]:
    """The options the user gave: those that are not None."""
    return {k: v for k, v in options.items() if v is not None}


# ---- option values --------------------------------------------------------------------------------


def floats(text: str, option: str) -> tuple[float, ...]:
    """A comma-separated list of numbers given to ``--option`` (empty items are skipped)."""
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UsageError(f"--{option} takes comma-separated numbers, e.g. 1,2,4; got {text!r}") from None


def check_outputs(*outputs: tuple[str, Any], overwrite: bool = False) -> None:
    """Fail at once when an output file (``(option, path)``, path None = not asked for) could not be
    written (exit 4) or is a file ssacli did not write and ``overwrite`` was not given (exit 2):
    commands call this first, before they import the model stack. ``-`` is stdout
    (:mod:`ssacli.cli.outputs`), which one output at most may take (exit 2)."""
    to_stdout = [option for option, path in outputs if is_stdout(path)]
    if len(to_stdout) > 1:
        raise UsageError(f"{' and '.join(to_stdout)} both ask for stdout ('-'); give all but one a file name")
    for option, path in outputs:
        if path is not None and not is_stdout(path):
            check_writable(path, option)
            if Path(path).expanduser().is_file():
                from ..preflight import check_replaceable_file  # torch-free

                check_replaceable_file(path, option, overwrite)


def check_inputs(
    *,
    scorers: Iterable[str | None] = (),
    models: Iterable[str | None] = (),
    offline: bool = False,
    revision: str | None = None,
    device: str | None = None,
    allow_pickle: bool = False,
    dtype: str | None = None,
    device_map: str | None = None,
    max_memory: Any = None,
) -> None:
    """Fail at once, before torch is imported, on a bad scorer spec (exit 2), a ``device`` not there
    (exit 2; torch alone where only torch can tell) and a MODEL that names nothing or whose folder's
    headers are not a model's (exit 4; a builtin:NAME not bundled: exit 2; offline, a Hub id not
    cached: exit 4; pickle-only weights without ``allow_pickle``, the command's --allow-pickle), a
    ``dtype`` no model loads in, a ``device_map`` and ``max_memory`` that cannot place it (exit 2),
    with the messages building the scorer and loading the model would give (None: not given).
    ``revision`` is the first model's; the others name theirs as org/name@REV. Then a Hub id not in
    the cache is downloaded, its bars on stderr before the command's live display (which would hold
    them back). Commands call this after :func:`check_outputs`."""
    for spec in scorers:
        if spec is not None:
            parse_spec(spec)
    if device is not None:
        check_device(device)
    if dtype is not None:
        check_dtype(dtype)
    check_placement(device_map, max_memory, device or D.DEVICE)
    models = list(models)
    for index, ref in enumerate(models):
        if ref is not None:
            check_model_reference(ref, offline, revision if index == 0 else None, allow_pickle)
    for index, ref in enumerate(models):  # all are valid: now what must be downloaded, with its bars
        if ref is not None:
            fetch_model_reference(ref, offline, revision if index == 0 else None)


# ---- --debug and the one-line error report ----------------------------------------------------------

_debug = {"on": False}  # set by the root --debug option for the command it runs


def set_debug(value: bool) -> None:
    """Record the root --debug flag (errors then keep their traceback)."""
    _debug["on"] = value


def debugging() -> bool:
    """Whether --debug was given: errors should propagate with their traceback."""
    return _debug["on"]


def print_error(err: BaseException) -> None:
    """The one line a failed command prints on stderr: the message of an error the user can fix,
    or, for a bug, its type and a pointer to --debug."""
    if isinstance(err, SsacliError):
        line = f"[bold red]error:[/] {escape(str(err))}"
    else:
        line = (
            f"[bold red]internal error:[/] {type(err).__name__}: {escape(str(err))} "
            "(rerun with --debug for the traceback)"
        )
    Console(stderr=True).print(line, highlight=False, soft_wrap=True)


# ---- progress -----------------------------------------------------------------------------------------


def bar_columns(*extra) -> list:
    """The progress-bar columns every command uses, then ``extra``: description, bar, done/total
    (empty while the total is unknown: a model still loading read "0/None")."""
    from rich.progress import BarColumn, ProgressColumn, TextColumn
    from rich.text import Text

    class Done(ProgressColumn):
        def render(self, task) -> Text:
            return Text("" if task.total is None else f"{task.completed:g}/{task.total:g}")

    return [TextColumn("{task.description}"), BarColumn(), Done(), *extra]


@contextmanager
def progress(
    description: str,
    columns: list | None = None,
    *,
    quiet: bool = False,
    always: bool = False,
    transient: bool = True,
    **task: Any,
) -> Iterator[Callable[..., None] | None]:
    """A live display on stderr while a long call runs: a progress bar with ``columns``, or a
    one-line status when there are none. Yields ``update(description=…, **task_fields)``, or None
    when nothing is shown: with ``quiet``, and when stderr is not a terminal unless ``always``."""
    stderr = Console(stderr=True)
    if quiet or not (always or stderr.is_terminal):
        yield None
    elif columns is None:
        with stderr.status(description) as status:

            def update(description: str | None = None, **_: Any) -> None:
                if description is not None:
                    status.update(description)

            yield update
    else:
        from rich.progress import Progress

        with Progress(*columns, console=stderr, transient=transient) as bar:
            yield partial(bar.update, bar.add_task(description, **task))
