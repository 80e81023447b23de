"""Errors ssacli raises on purpose, and the exit codes the CLI maps them to (the only mapping).

Every error a user can cause carries one line that names the problem and the fix. The CLI prints
that line (no traceback unless ``--debug``) and exits with :func:`exit_code` (README, "Exit codes").
``ssacli check`` exits with CI-oriented codes instead (:func:`check_exit_code`, docs/ci.md), so a
pipeline can tell "the model regressed" from "the gate is misconfigured" and "the tool broke".
"""

from __future__ import annotations

EXIT_INTERNAL = 1  # a bug
EXIT_USAGE = 2  # bad command-line usage, option value or scorer spec
EXIT_UNSUPPORTED = 3  # the model's attention cannot be routed through ssacli
EXIT_INPUT = 4  # a model or file missing, unreadable or inconsistent; an output that cannot be written
EXIT_FAILED = 5  # the job ran but failed (e.g. training diverged)
EXIT_INTERRUPTED = 130  # Ctrl-C / SIGTERM (128 + SIGINT, as shells report it)

# `ssacli check` (docs/ci.md, README "Exit codes"); Ctrl-C still ends it with EXIT_INTERRUPTED
EXIT_CHECK_PASSED = 0  # every requirement passed
EXIT_CHECK_FAILED = 1  # a requirement failed
EXIT_CHECK_USAGE = 2  # usage or input error: fix the invocation, the config or its files
EXIT_CHECK_UNCHECKABLE = 3  # the model cannot be checked (unsupported, not whole, or ssacli broke)

# Every code `ssacli check` ends with and its meaning, in order: the one list `check --help`, README and
# docs/ci.md show (tests/contracts/test_exit_codes.py holds them to it). An output that cannot be
# written is EXIT_INPUT, as in every command (check_exit_code); Ctrl-C is EXIT_INTERRUPTED everywhere.
CHECK_EXIT_CODES = (
    (EXIT_CHECK_PASSED, "pass"),
    (EXIT_CHECK_FAILED, "a requirement failed"),
    (EXIT_CHECK_USAGE, "usage or input error"),
    (EXIT_CHECK_UNCHECKABLE, "the model cannot be checked"),
    (EXIT_INPUT, "an output cannot be written"),
)


def check_exit_codes_text() -> str:
    """ "0 pass, 1 a requirement failed, …": CHECK_EXIT_CODES in one line, as help and docs say it."""
    return ", ".join(f"{code} {meaning}" for code, meaning in CHECK_EXIT_CODES)


class SsacliError(Exception):
    """Base class: a user-facing problem with a one-line message and an exit code."""

    exit_code = EXIT_INTERNAL


class UsageError(SsacliError, ValueError):
    """An option or argument value is invalid."""

    exit_code = EXIT_USAGE


class SpecError(UsageError):
    """A scorer spec string is malformed, names an unknown scorer or an unknown/invalid option."""


class UnsupportedModelError(SsacliError):
    """The model family does not route attention through transformers' AttentionInterface."""

    exit_code = EXIT_UNSUPPORTED


class InputError(SsacliError):
    """A model path or file is missing, unreadable or inconsistent."""

    exit_code = EXIT_INPUT


class BrokenModelError(InputError):
    """The model is not its checkpoint whole, so nothing about it can be measured or trained: a tensor
    missing or one its config does not build, a tokenizer past its embedding, weights that are NaN or
    ±inf (:mod:`ssacli.models.integrity`). ``check`` reads it as a model that cannot be checked
    (neither a passed nor a failed gate)."""


class OutputError(SsacliError):
    """An output (--out, --json, --html, a checkpoint) cannot be written: a read-only folder, a full
    disk. Outputs are written to a temporary sibling and renamed, so the target is left as it was."""

    exit_code = EXIT_INPUT


class JobFailedError(SsacliError):
    """The job itself failed, e.g. training diverged."""

    exit_code = EXIT_FAILED


class InterruptedJobError(SsacliError):
    """A long job stopped on SIGINT/SIGTERM after writing a checkpoint it can resume from."""

    exit_code = EXIT_INTERRUPTED


class InterruptError(SsacliError):
    """Ctrl-C anywhere else: the command stopped, and left no half-written file (writes are atomic)."""

    exit_code = EXIT_INTERRUPTED


def exit_code(err: BaseException) -> int:
    """The exit code of a command that ended with ``err``: its own for an SsacliError, else a bug's."""
    return err.exit_code if isinstance(err, SsacliError) else EXIT_INTERNAL


def check_exit_code(err: BaseException) -> int:
    """The exit code of an ``ssacli check`` that ended with ``err``: an output that cannot be written
    is EXIT_INPUT, as in every command; other usage and input errors are the user's to fix;
    anything else, a model with non-finite weights included, means the model cannot be checked."""
    if isinstance(err, OutputError):
        return EXIT_INPUT
    if isinstance(err, BrokenModelError):
        return EXIT_CHECK_UNCHECKABLE
    return EXIT_CHECK_USAGE if isinstance(err, UsageError | InputError) else EXIT_CHECK_UNCHECKABLE
