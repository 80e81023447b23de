"""Hub ids the way transformers reads them, and the commit their weights come from.

A Hub id is ``org/name``, with a revision as ``org/name@REV`` or ``--revision REV`` (a branch, a tag
or a commit hash; ``main`` when none). It is fetched into huggingface_hub's cache (``HF_HOME``,
``HF_HUB_CACHE``) when not there, unless offline: ``HF_HUB_OFFLINE=1`` (or ``TRANSFORMERS_OFFLINE=1``)
or ``--offline`` (``LoadOptions.offline``), where only the cache is read.

:func:`resolve` turns the id into a :class:`HubModel` before anything loads: offline, the commit that
the cache's ``refs/REV`` names; online, one request (HEAD of config.json at REV, no retries, within
huggingface_hub's etag timeout) whose answer names the commit. Config, weights and tokenizer then
all load at that commit (one snapshot, even if the branch moves meanwhile), from the cache alone
when it holds that commit's config and weights, and every result records it
(:meth:`HubModel.record`). Without the network a cached model loads from the cache, as
transformers does; an uncached one fails at once with one line naming offline mode: the retry loop
huggingface_hub enters when a file is neither reachable nor cached (5 retries a file, ~2 minutes a
model) is never reached.

:func:`fetch` (the CLI, before its live display starts) downloads what is missing with
huggingface_hub's own bars, and :func:`quiet_progress` keeps transformers' per-layer "Loading weights"
bars out of ssacli's output while the Hub's stay visible: a multi-GB download must not look hung.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError, UsageError

DEFAULT_REVISION = "main"
COMMIT = re.compile(r"[0-9a-f]{40}")  # a full commit hash: names one snapshot, nothing to resolve
_TRUE = {"1", "ON", "YES", "TRUE"}  # what huggingface_hub reads as true in HF_HUB_OFFLINE
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
# HTTP statuses that mean "the Hub is not there right now", not "no such model"
_UNAVAILABLE = {408, 429, 500, 502, 503, 504}


@dataclass(frozen=True)
class HubModel:
    """A Hub id resolved: the repository, the revision asked for, the commit it names, and whether
    loading must stay in the cache (offline, or the Hub unreachable with the snapshot cached)."""

    repo_id: str
    revision: str
    commit: str
    cache_only: bool

    def record(self) -> dict[str, str]:
        """What results, records and baselines keep: which weights were measured."""
        return {"repo": self.repo_id, "revision": self.revision, "commit": self.commit}


def split_revision(ref: str) -> tuple[str, str | None]:
    """``org/name@REV`` -> (``org/name``, ``REV``); without ``@``, (ref, None)."""
    repo_id, sep, revision = ref.partition("@")
    return (repo_id, revision or None) if sep else (ref, None)


def asked_revision(ref: str, revision: str | None) -> str:
    """The revision MODEL and ``--revision`` ask for together (``main`` when neither does)."""
    repo_id, in_ref = split_revision(ref)
    if in_ref is not None and revision is not None and in_ref != revision:
        raise UsageError(
            f"'{ref}' names revision '{in_ref}' and --revision names '{revision}'; give one of them"
        )
    return in_ref or revision or DEFAULT_REVISION


def offline_reason(offline: bool) -> str | None:
    """Why Hub downloads are off (``--offline``, or the variable that says so), None when they are on.
    The variables are read now as well as when huggingface_hub was imported, so that a process that
    sets them after importing it is offline too."""
    if offline:
        return "--offline"
    for name in OFFLINE_VARIABLES:
        if os.environ.get(name, "").upper() in _TRUE:
            return f"{name}=1"
    from huggingface_hub import constants

    return "HF_HUB_OFFLINE=1" if constants.HF_HUB_OFFLINE else None


def hub_cache() -> Path:
    """huggingface_hub's cache folder (``HF_HUB_CACHE``, else ``HF_HOME``/hub), as it reads it."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE).expanduser()


def cached_commit(repo_id: str, revision: str) -> str | None:
    """The commit of ``repo_id`` at ``revision`` whose snapshot the cache holds (None: not cached).
    The cache's layout: ``models--ORG--NAME/refs/REV`` holds the commit a branch or tag last resolved
    to, ``models--ORG--NAME/snapshots/COMMIT/`` its files."""
    folder = hub_cache() / f"models--{repo_id.replace('/', '--')}"
    if COMMIT.fullmatch(revision):
        commit: str | None = revision
    else:
        try:
            commit = (folder / "refs" / revision).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            return None
    return commit if commit and (folder / "snapshots" / commit / "config.json").is_file() else None


def complete_snapshot(repo_id: str, commit: str) -> bool:
    """Whether the cache holds ``commit``'s config and weights (a single file or a sharded index),
    so loading needs the Hub no more: transformers would otherwise ask it, file by file, for each
    optional file the snapshot lacks (a chat template, tokenizer files a model does not have)."""
    folder = hub_cache() / f"models--{repo_id.replace('/', '--')}" / "snapshots" / commit
    weights = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
    return (folder / "config.json").is_file() and any((folder / name).is_file() for name in weights)


def resolve(ref: str, revision: str | None = None, offline: bool = False) -> HubModel:
    """The Hub id ``ref`` (``org/name`` or ``org/name@REV``) at ``revision`` as a :class:`HubModel`;
    one line (InputError, exit 4) when it cannot be had: not cached while offline, the Hub
    unreachable and nothing cached, no such repository, revision or config.json."""
    repo_id, _ = split_revision(ref)
    rev = asked_revision(ref, revision)
    fetched = _fetched.pop((repo_id, rev, offline), None)
    if fetched is not None:  # the CLI's fetch just resolved it: no second request
        return fetched
    cached = cached_commit(repo_id, rev)
    why_offline = offline_reason(offline)
    if why_offline is not None:
        if cached is None:
            raise _not_cached_offline(repo_id, rev, why_offline)
        return HubModel(repo_id, rev, cached, cache_only=True)
    if cached is not None and cached == rev:  # a commit hash already cached: nothing to ask the Hub
        return HubModel(repo_id, rev, cached, cache_only=True)
    try:
        commit = _remote_commit(repo_id, rev)
        if complete_snapshot(repo_id, commit):  # nothing left to download: no request per file
            return HubModel(repo_id, rev, commit, cache_only=True)
    except _Unreachable as err:
        if cached is not None:  # as transformers does: the cached snapshot, without the network
            return HubModel(repo_id, rev, cached, cache_only=True)
        raise InputError(
            f"cannot reach the Hugging Face Hub to download '{repo_id}' ({err}) and it is not in the "
            f"cache ({hub_cache()}); connect to the network, or work offline (HF_HUB_OFFLINE=1 or "
            "--offline) with a model already in the cache or a local folder"
        ) from None
    return HubModel(repo_id, rev, commit, cache_only=False)


def check_available(ref: str, revision: str | None = None, offline: bool = False) -> None:
    """Refuse, as :func:`resolve` would, what can be told without the network or torch: two
    revisions, or offline a Hub id not in the cache (the CLI checks MODEL here before the model
    stack loads, so the line comes in a second, not after importing torch)."""
    repo_id, _ = split_revision(ref)
    rev = asked_revision(ref, revision)
    why_offline = offline_reason(offline)
    if why_offline is not None and cached_commit(repo_id, rev) is None:
        raise _not_cached_offline(repo_id, rev, why_offline)


def _not_cached_offline(repo_id: str, revision: str, why: str) -> InputError:
    return InputError(
        f"'{repo_id}' (revision {revision}) is not in the Hugging Face cache ({hub_cache()}) and offline "
        f"mode is on ({why}); download it once online (without --offline and HF_HUB_OFFLINE), point "
        "HF_HOME at the cache that holds it, or give a local folder"
    )


# Resolutions the CLI's fetch made, each taken by the one load that follows it (a long-lived process
# that loads again asks again: a branch may have moved)
_fetched: dict[tuple[str, str, bool], HubModel] = {}
# What a download fetches: config, tokenizer and safetensors weights (a pickle-only repository is
# refused at load unless --allow-pickle, and then transformers fetches its .bin itself); never the
# ONNX, GGUF, TensorFlow or Flax copies many repositories also hold
FETCHED = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]


def fetch(ref: str, revision: str | None = None, offline: bool = False) -> HubModel:
    """Download the Hub id ``ref`` into the cache unless it is there (the one-line errors of
    :func:`resolve`, else a failed download in one line). The CLI calls this before it starts its
    live display, whose redirected stderr holds back a line until it ends: huggingface_hub's bars,
    drawn with carriage returns, would only show once the download is over."""
    hub = resolve(ref, revision, offline)
    if not hub.cache_only:
        from huggingface_hub import snapshot_download

        try:
            snapshot_download(hub.repo_id, revision=hub.commit, allow_patterns=FETCHED)
        except Exception as err:
            raise InputError(
                f"downloading '{hub.repo_id}' at {hub.commit[:12]} failed ({_first_line(err)}); run again "
                "to resume, or work offline (HF_HUB_OFFLINE=1 or --offline) with a model in the cache"
            ) from None
        hub = HubModel(
            hub.repo_id, hub.revision, hub.commit, cache_only=complete_snapshot(hub.repo_id, hub.commit)
        )
    _fetched[(hub.repo_id, hub.revision, offline)] = hub  # the load that follows in this process
    return hub


class _Unreachable(Exception):
    """The Hub did not answer (no network, a timeout, a 5xx): the cache may still serve."""


def _remote_commit(repo_id: str, revision: str) -> str:
    """The commit ``revision`` names on the Hub: one HEAD request of config.json, not retried."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    url = hf_hub_url(repo_id, "config.json", revision=revision)
    try:
        meta = get_hf_file_metadata(url, timeout=constants.HF_HUB_ETAG_TIMEOUT)
    except GatedRepoError:
        raise InputError(
            f"'{repo_id}' is gated on the Hub: accept its terms on its page, then log in (hf auth login "
            "or HF_TOKEN)"
        ) from None
    except RepositoryNotFoundError:
        raise InputError(
            f"no model '{repo_id}' on the Hugging Face Hub (or it is private: log in with hf auth login "
            "or HF_TOKEN); check the id, or give a local folder"
        ) from None
    except RevisionNotFoundError:
        message = f"'{repo_id}' has no revision '{revision}' on the Hub; check --revision or @REV"
        raise InputError(message) from None
    except EntryNotFoundError:
        raise InputError(
            f"'{repo_id}' at {revision} has no config.json: not a transformers model ssacli can load"
        ) from None
    except HfHubHTTPError as err:
        status = getattr(getattr(err, "response", None), "status_code", None)
        if status in _UNAVAILABLE:
            raise _Unreachable(f"HTTP {status}") from None
        raise InputError(f"the Hub refused '{repo_id}' ({_first_line(err)})") from None
    except OfflineModeIsEnabled as err:
        raise _Unreachable(_first_line(err)) from None
    except Exception as err:
        if not _connection_error(err):
            raise
        raise _Unreachable(_first_line(err)) from None
    if not meta.commit_hash:
        raise _Unreachable("the answer named no commit (a proxy in between?)")
    return meta.commit_hash


def _connection_error(err: BaseException) -> bool:
    """A failure to talk to the Hub at all: a socket error, a timeout, or an error of the HTTP
    client huggingface_hub uses (httpx, or its own httpx2)."""
    module = type(err).__module__.split(".")[0]
    return isinstance(err, OSError | TimeoutError) or module in {"httpx", "httpx2", "httpcore", "requests"}


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0].rstrip(". ") if text else type(err).__name__


def load_keywords(hub: HubModel | None) -> dict[str, Any]:
    """The keywords every from_pretrained of a Hub model takes: its commit, and the cache alone when
    it must stay there (for a local folder: none, and the cache alone)."""
    if hub is None:
        return {"local_files_only": True}
    return {"revision": hub.commit, "local_files_only": hub.cache_only}


@contextmanager
def quiet_progress() -> Iterator[None]:
    """No "Loading weights" / "Writing model shards" bars from transformers inside ssacli's output,
    while huggingface_hub's download bars stay as they were: transformers' switch turns both off,
    so the Hub's is turned back on (unless HF_HUB_DISABLE_PROGRESS_BARS or the caller had them off)."""
    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hub_was_disabled = are_progress_bars_disabled()
    hf_logging.disable_progress_bar()
    if not hub_was_disabled:
        enable_progress_bars()
    try:
        yield
    finally:
        if was_enabled:  # both back on, as before
            hf_logging.enable_progress_bar()
