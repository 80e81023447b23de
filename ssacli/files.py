"""Writing outputs atomically: a temp file (or folder) beside the target, then a rename.

A write that fails (a full disk, a read-only folder) or is interrupted leaves the target as it was
and no temp file behind; :func:`output_error` turns the OS error into one line naming the fix.
:func:`writer_lock` keeps a second job from writing the same output folder while one runs.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .errors import OutputError, UsageError

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_NO_PERMISSION = (errno.EACCES, errno.EPERM, errno.EROFS)


def output_error(path: str | Path, err: BaseException) -> OutputError:
    """One line for an error raised while writing ``path`` (an OSError, or safetensors' own error
    type, which wraps the OS error in its message)."""
    code = getattr(err, "errno", None)
    text = str(err)
    if code in _NO_SPACE or "os error 28" in text or "No space left" in text:
        fix = "free some space or write elsewhere"
        reason = os.strerror(errno.ENOSPC)
    elif code in _NO_PERMISSION or "os error 13" in text or "os error 30" in text:
        fix = "choose a folder you can write to"
        reason = getattr(err, "strerror", None) or text.strip().splitlines()[0]
    else:
        fix = "check the path, or write elsewhere"
        reason = getattr(err, "strerror", None) or (text.strip().splitlines() or [type(err).__name__])[0]
    return OutputError(f"cannot write {path}: {reason}; {fix} (nothing was written there)")


def check_writable(path: str | Path, option: str) -> None:
    """Fail before any work when ``path`` (a file to write later) could not be created."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise UsageError(f"{option} '{path}' is a folder; give a file name")
    parent = path.absolute().parent
    while not parent.exists():  # write_text creates the missing folders
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(
            f"cannot write {option} '{path}': {parent} is not a writable folder; choose another"
        )


def check_writable_folder(path: str | Path, option: str) -> None:
    """Fail before any work when ``path`` (a folder to write later) could not be created or written."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} '{path}' is a file; give a folder")
    parent = path.absolute()
    while not parent.exists():
        parent = parent.parent
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(
            f"cannot write {option} '{path}': {parent} is not a writable folder; choose another"
        )


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def publish(tmp: str | Path, path: str | Path, *, directory: bool = False) -> None:
    """Give a temp file (or a folder and the files in it) the permissions a plain create would
    have, then rename it into place."""
    mask = _umask()
    if directory:
        for file in Path(tmp).rglob("*"):  # a folder's sub-folders (a run's best/) stay searchable
            os.chmod(file, (0o777 if file.is_dir() else 0o666) & ~mask)
    os.chmod(tmp, (0o777 if directory else 0o666) & ~mask)
    os.replace(tmp, path)


def write_text(text: str, path: str | Path) -> None:
    """Write ``text`` to ``path`` whole or not at all (an OutputError says why not)."""
    write_bytes(text.encode("utf-8"), path)


def write_bytes(data: bytes, path: str | Path) -> None:
    """Write ``data`` to ``path`` whole or not at all (an OutputError says why not)."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        publish(tmp, path)
    except OSError as err:
        raise output_error(path, err) from err
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)


def json_text(data: Any) -> str:
    """How ssacli writes a JSON document (:func:`write_json`)."""
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def write_json(data: Any, path: str | Path) -> None:
    write_text(json_text(data), path)


def replace_folder(tmp: str | Path, out: str | Path) -> None:
    """Rename the finished folder ``tmp`` to ``out``; an old ``out`` is moved aside first and put
    back if the rename fails or is interrupted, so ``out`` is always either old or new."""
    tmp, out = Path(tmp), Path(out)
    if not out.exists():
        publish(tmp, out, directory=True)
        return
    old = out.with_name(f".{out.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    out.rename(old)
    try:
        publish(tmp, out, directory=True)
    except BaseException:
        if not out.exists():
            old.rename(out)
        raise
    shutil.rmtree(old, ignore_errors=True)


# ---- one writer per output folder --------------------------------------------------------------------

_HELD: dict[
    Path, int
] = {}  # locks this process holds → how deeply (a job inside a job: convert, then finetune)


def lock_path(out: str | Path) -> Path:
    """The lock of the output folder ``out``: a hidden file beside it (not inside: the folder is
    replaced whole by every checkpoint)."""
    out = Path(out).expanduser().absolute()
    return out.with_name(f".{out.name}.lock")


def writer_gone(marker: Path) -> bool:
    """Whether the process named in ``marker`` (JSON with pid and host) has ended: only for a
    process of this host; a marker that cannot be read, another host's, or this process's own is
    never taken for gone."""
    try:
        writer = json.loads(marker.read_text())
        pid, host = int(writer["pid"]), writer["host"]
    except (OSError, ValueError, TypeError, KeyError):
        return False
    if host != socket.gethostname() or pid == os.getpid():
        return False  # another machine's writer (a shared filesystem), or this process's own
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # alive, another user's
    return False


@contextmanager
def writer_lock(out: str | Path, option: str = "--out") -> Iterator[None]:
    """Hold the lock of the output folder ``out`` for the job inside: a second job asking for it
    (another process, on any host sharing the filesystem) is refused at once with a UsageError naming
    the writer, instead of running the whole job and failing at its first write. A lock left by a
    process of this host that has ended (SIGKILL, power loss) is taken over; this process may nest.
    Under torchrun or accelerate launch only rank 0 holds it: the other ranks never write ``out``."""
    if int(os.environ.get("RANK", "0")) != 0:
        yield
        return
    path = lock_path(out)
    if path in _HELD:
        _HELD[path] += 1
        try:
            yield
        finally:
            _HELD[path] -= 1
        return
    _acquire(path, Path(out), option)
    _HELD[path] = 1
    try:
        yield
    finally:
        del _HELD[path]
        try:
            path.unlink()
        except OSError:
            pass


def _acquire(path: Path, out: Path, option: str) -> None:
    record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()})
    for _ in range(2):  # a second try after taking over a dead writer's lock
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if writer_gone(path):
                path.unlink(missing_ok=True)
                continue
            raise UsageError(_busy(path, out, option)) from None
        except OSError as err:
            raise output_error(out, err) from err
        with os.fdopen(fd, "w") as handle:
            handle.write(record)
        return
    raise UsageError(_busy(path, out, option))


def _busy(path: Path, out: Path, option: str) -> str:
    try:
        writer = json.loads(path.read_text())
        who = f"process {int(writer['pid'])} on {writer['host']}"
        since = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(writer["since"])))
        who += f" since {since}"
    except (OSError, ValueError, TypeError, KeyError):
        who = "another process"
    return (
        f"{option} {out} is being written by another ssacli job ({who}); wait for it to end or choose "
        f"another {option} (if no such job runs, delete {path})"
    )
