"""The `ssacli` command line: a thin Typer layer over the public API in ssacli/__init__.py.

This module builds the app and registers every command, in the order ``ssacli --help`` lists them;
the commands live in one module per group (diagnose, attribute, check, convert, train, report, icl) and never
import this one. Errors a user can cause (ssacli.errors.SsacliError) print one line and exit with
their documented code (ssacli.errors.exit_code); anything else prints one line too and exits 1;
click's usage errors (an option value out of range, a missing argument) one line too, exit 2.
--debug (before or after the command) prints the traceback first; the exit code stays the same.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import traceback
from contextlib import contextmanager

import typer

from .. import __version__
from ..errors import EXIT_USAGE, InterruptError, UsageError, exit_code
from . import attribute, check, convert, diagnose, icl, render, report, train
from .options import HelpCommand, HelpGroup, ModelCommand, debugging, print_error, set_debug


class _Commands(HelpGroup):
    """ssacli's command group: Ctrl-C inside a command ends like every other error, in one line and
    a documented exit code (130), rather than click's silent exit; --debug is read wherever it is."""

    def main(self, args=None, *rest, **kwargs):
        """--debug anywhere before a bare ``--`` is the root flag, taken out here: after the command
        (``ssacli diagnose … --debug``) it works as before it, and no command has to declare it."""
        args = list(sys.argv[1:] if args is None else args)
        end = args.index("--") if "--" in args else len(args)
        set_debug("--debug" in args[:end])
        args = [arg for i, arg in enumerate(args) if i >= end or arg != "--debug"]
        return super().main(args, *rest, **kwargs)

    def make_context(self, *args, **kwargs):
        with _one_line_usage():  # an unknown command or root option
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx):
        try:
            with _one_line_usage():  # a command's options and arguments are parsed in here
                return super().invoke(ctx)
        except KeyboardInterrupt as err:
            raise InterruptError(
                "interrupted; no file was left half-written (ssacli writes whole files or none), "
                "rerun the command to finish"
            ) from err


@contextmanager
def _one_line_usage():
    """click's usage errors (a value out of range, a missing argument, an unknown option) as every
    other ssacli error (issue 54): one line naming the problem and where the fix is, exit
    EXIT_USAGE, not click's usage lines and a boxed message."""
    try:
        yield
    except typer.TyperException as err:  # typer's (vendored) click exceptions; Exit and Abort are not
        if not hasattr(err, "format_message") or getattr(err, "exit_code", None) != EXIT_USAGE:
            raise
        message = err.format_message().strip().rstrip(".")
        if message[:1].isupper() and message[1:2].islower():
            message = message[0].lower() + message[1:]
        ctx = getattr(err, "ctx", None)
        path = ctx.command_path if ctx is not None else "ssacli"
        print_error(UsageError(f"{message}; see `{path} --help`"))
        raise typer.Exit(EXIT_USAGE) from err  # an exit, as click's own: any caller of the app sees 2


app = typer.Typer(
    cls=_Commands,
    name="ssacli",
    help="Attention-saturation diagnostics: swap softmax for SSA and other scorers, measure collapse.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion, --show-completion: bash, zsh, fish, PowerShell
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ssacli {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    debug: bool = typer.Option(
        False, "--debug", help="Show full tracebacks on errors (before or after the command)."
    ),
) -> None:
    pass  # --debug is read by _Commands.main, wherever it stands; declared here for --help


app.command("scorers", cls=HelpCommand)(diagnose.scorers_command)
app.command("diagnose", cls=ModelCommand)(diagnose.diagnose_command)
app.command("attribute", cls=ModelCommand)(attribute.attribute_command)
app.command("render", cls=HelpCommand)(render.render_command)
app.command("check", cls=HelpCommand)(check.check_command)
app.command("convert", cls=ModelCommand)(convert.convert_command)
app.command("finetune", cls=HelpCommand)(convert.finetune_command)
app.command("report", cls=HelpCommand)(report.report_command)
app.command("train", cls=HelpCommand)(train.train_command)

icl_app = typer.Typer(
    help="In-context-learning experiments: train small models on the paper's tasks, evaluate them "
    "under magnitude and length shift.",
    no_args_is_help=True,
    cls=HelpGroup,
)
icl_app.command("train", cls=HelpCommand)(icl.icl_train)
icl_app.command("eval", cls=HelpCommand)(icl.icl_eval)
icl_app.command("sweep", cls=HelpCommand)(icl.icl_sweep)
app.add_typer(icl_app, name="icl")


def _terminate(signum, frame) -> None:
    raise KeyboardInterrupt  # SIGTERM ends a command like Ctrl-C: cleanups run, one line, exit 130


_ENDED: list[int] = []  # the exit code of the command this process ran, once it has ended


def _exit_ended(signum, frame) -> None:
    """SIGTERM after the command ended (its outputs complete; Python, torch and the rest shutting
    down, which takes a while): the process ends at once with the command's own exit code, not 143."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(_ENDED[-1])


def _at_shutdown() -> None:
    if _ENDED and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_ended)


def _ended(done: SystemExit) -> None:
    """Note the command's exit code, and that from interpreter shutdown on SIGTERM keeps it
    (:func:`_exit_ended`); the first command of a process registers that (atexit runs it first)."""
    if not _ENDED:
        atexit.register(_at_shutdown)
    _ENDED.append(done.code if isinstance(done.code, int) else 0 if done.code is None else 1)


def main() -> None:
    """Console-script entry point: map errors to one line and a documented exit code; with --debug
    the traceback comes first, and the exit code stays the documented one. A SIGTERM that arrives
    once the command has ended leaves that code (:func:`_exit_ended`), not 143."""
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if in_main_thread else None
    done: SystemExit | None = None
    try:
        app()
        done = SystemExit(0)
    except SystemExit as err:
        done = err
        raise
    except Exception as err:  # SsacliError: its own code; anything else is a bug (exit 1)
        done = SystemExit(exit_code(err))
        if debugging():
            traceback.print_exc()
        print_error(err)
        sys.exit(exit_code(err))
    finally:
        if in_main_thread:
            if done is not None:
                _ended(done)
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
