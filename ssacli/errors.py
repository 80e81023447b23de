"""Errors ssacli raises on purpose, and the exit codes the CLI maps them to.

Every error a user can cause carries one line that names the problem and the fix. The CLI prints
that line (no traceback unless ``--debug``) and exits with the error's code.
"""

from __future__ import annotations

# Documented exit codes (README, "Exit codes"). 0 = success, 1 = unexpected internal error.
EXIT_USAGE = 2  # bad command-line usage or a bad scorer spec
EXIT_UNSUPPORTED = 3  # the model's attention cannot be routed through ssacli


class SsacliError(Exception):
    """Base class: a user-facing problem with a one-line message and an exit code."""

    exit_code = 1


class SpecError(SsacliError, ValueError):
    """A scorer spec string is malformed, names an unknown scorer or an unknown/invalid option."""

    exit_code = EXIT_USAGE


class UnsupportedModelError(SsacliError):
    """The model family does not route attention through transformers' AttentionInterface."""

    exit_code = EXIT_UNSUPPORTED
