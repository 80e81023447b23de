"""Which weights a result measured, so that a baseline can say whether it measured these.

A Hub model is named by its commit (:meth:`ssacli.models.hub.HubModel.record`): ``{"repo",
"revision", "commit"}``. A local folder (a builtin, a ``save_pretrained`` or ssacli folder, a GGUF
file) by a content hash, ``{"sha256", "files"}``: sha256 over its weight files sorted by name, each
as its name, its size and its bytes, streamed (never read whole). A folder's name, its config and
its tokenizer are not part of it: the same weights copied elsewhere hash the same, and what is
measured is the weights.

Hashing reads every byte (tens of seconds for a 7B model: docs/performance.md), so a digest
is kept in ssacli's cache (``$SSACLI_CACHE``, else ~/.cache/ssacli: ``weights-sha256.json``) under
the files' names, sizes, modification times and inodes: a file rewritten in place changes at least
its time, and a load of an unchanged folder reads nothing but that list. Torch-free.

The cache is trusted as the kernel cache is (:func:`ssacli.kernels.native_build.open_checked`): a
digest file someone else could have written (another owner, writable by group or others, a
symbolic link, in a folder that is any of these) is ignored with one warning line and the weights
are hashed again; the file is then replaced by a private one where its folder passes the check,
and nothing is written where the folder fails it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
# Not weights: the optimizer state a training run resumes from (ssacli.models.checkpoint.TRAINER_FILE)
NOT_WEIGHTS = frozenset({"trainer.safetensors"})
CACHE_FILE = "weights-sha256.json"
CACHE_ENTRIES = 256  # the most recent digests kept (a few KB)
_CHUNK = 1 << 22


def weight_files(path: Path) -> list[Path]:
    """The weight files of a folder (top level: ``best/`` and other subfolders are other models), or
    the file itself, sorted by name."""
    if path.is_file():
        return [path]
    found = [p for p in path.iterdir() if p.suffix in WEIGHT_SUFFIXES and p.name not in NOT_WEIGHTS]
    return sorted((p for p in found if p.is_file()), key=lambda p: p.name)


def content_record(path: str | Path) -> dict[str, Any] | None:
    """``{"sha256", "files"}`` of a local model (folder or file); None when it has no weight files or
    they cannot be read (the load that follows says why)."""
    path = Path(path)
    try:
        files = weight_files(path)
        if not files:
            return None
        stats = [(f.name, f.stat()) for f in files]
    except OSError:
        return None
    key = json.dumps([str(path.resolve()), [(n, s.st_size, s.st_mtime_ns, s.st_ino) for n, s in stats]])
    cached = _read_cache()
    digest = cached.get(key) if cached is not None else None
    if digest is None:
        try:
            digest = _digest(files)
        except OSError:
            return None
        if cached is not None:
            cached[key] = digest
            _write_cache(cached)
    return {"sha256": digest, "files": len(files)}


def _digest(files: list[Path]) -> str:
    total = hashlib.sha256()
    for file in files:
        total.update(file.name.encode("utf-8") + b"\0" + file.stat().st_size.to_bytes(8, "little"))
        with open(file, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                total.update(chunk)
    return total.hexdigest()


def difference(
    then: dict[str, Any] | None, now: dict[str, Any] | None, what: str = "the baseline"
) -> str | None:
    """Why ``what`` (a baseline: ``then``) measured other weights than this run (``now``), or None
    when they are the same or cannot be compared (one side unrecorded, or a Hub commit against a
    folder's hash)."""
    if not isinstance(then, dict) or not isinstance(now, dict):
        return None
    if then.get("commit") and now.get("commit") and then["commit"] != now["commit"]:
        return (
            f"{what} measured {then.get('repo')} at commit {then['commit'][:12]}, this run "
            f"{now.get('repo')} at commit {now['commit'][:12]}: other weights"
        )
    if then.get("sha256") and now.get("sha256") and then["sha256"] != now["sha256"]:
        return (
            f"{what} measured weights with sha256 {then['sha256'][:12]}, this model's are "
            f"{now['sha256'][:12]}: other weights"
        )
    return None


def describe(record: dict[str, Any] | None) -> str | None:
    """One short phrase for a report: ``org/name@abc123def456`` or ``sha256 abc123def456``."""
    if not record:
        return None
    if record.get("commit"):
        return f"{record.get('repo')}@{record['commit'][:12]}"
    return f"sha256 {record['sha256'][:12]}" if record.get("sha256") else None


def _cache_path() -> Path:
    from ..kernels.native_build import cache_root  # the one rule for ssacli's cache folder

    return cache_root() / CACHE_FILE


_WARNED: set[str] = set()  # one warning per untrusted cache file and process


def _read_cache() -> dict[str, str] | None:
    """The cached digests ({} when there are none or they cannot be read), or None when the cache
    folder fails the kernel cache's check (then nothing is written there either). A digest file
    that fails it while its folder passes is ignored and will be replaced by a private one. Either
    is said in one warning line, once per process."""
    from ..files import warn
    from ..kernels.native_build import UnsafeLibrary, cache_root, open_checked

    path = _cache_path()
    try:
        fd = open_checked(path, cache_root())
    except UnsafeLibrary as err:
        replaced = err.path == path  # the folders passed: this user's own, private cache
        if str(err) not in _WARNED:
            _WARNED.add(str(err))
            fix = (
                "replacing it with a private one" if replaced else
                "hashing the weights instead (make the folder yours and private, or point SSACLI_CACHE "
                "at a folder of yours)"
            )  # fmt: skip
            warn(f"ignoring ssacli's cache {err.path}: {err.reason}; {fix}")
        return {} if replaced else None
    except OSError:
        return {}
    try:
        with os.fdopen(fd, "rb") as handle:
            data = json.loads(handle.read().decode("utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, str)} if isinstance(data, dict) else {}


def _write_cache(entries: dict[str, str]) -> None:
    """Best effort: a read-only home only costs the next load a rehash."""
    from ..errors import OutputError
    from ..files import write_text

    kept = dict(list(entries.items())[-CACHE_ENTRIES:])
    try:
        path = _cache_path()
        os.makedirs(path.parent, mode=0o700, exist_ok=True)
        write_text(json.dumps(kept), path)
        os.chmod(path, 0o600)  # never group-writable (umask 002), which the next read would refuse
    except (OSError, OutputError):  # a cache is never worth a failed command
        pass
