# Long on purpose: the one owner of how ssacli writes (docs/architecture.md); the lock and publishing
# share the temp-file naming and the writer records, which a split would spread over two modules.
"""Writing outputs atomically: a temp file (or folder) beside the target, then a rename.

A write that fails (a full disk, a read-only folder) or is interrupted leaves the target as it was
and no temp file behind; :func:`output_error` turns the OS error into one line naming the fix.
:func:`writer_lock` keeps a second job from writing the same output folder while one runs.

Writes stay where the user pointed (docs/faults.md, "Writes, caches and faults"): a path built
from a plan, a label or a name is :func:`confined` to its folder; publishing never follows a
symbolic link (one inside a folder about to be published is dropped with one warning line) and never
changes the mode of a file through another link to it; a temp file is named after its writer
(:func:`_make_temp`), so that one a killed writer left is removed by the next write and nothing
else ever is.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .errors import OutputError, UsageError

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_NO_PERMISSION = (errno.EACCES, errno.EPERM, errno.EROFS)
_NO_HARD_LINKS = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS)  # what link() says there


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


def plain_name(name: str, what: str, where: str | Path = "its folder") -> str:
    """``name`` (one a plan or a label gave, not the user's command line) once it is one plain file
    or folder name: not empty, not '.' or '..', no '/', '\\' or NUL; else a UsageError naming
    ``what``, before anything is written."""
    if not name or name in (".", "..") or re.search(r"[/\\\0]", name):
        raise UsageError(
            f"{what} {name!r} must be a plain name inside {where} (no '/', '\\' or '..'); rename it"
        )
    return name


def confined(base: str | Path, name: str, what: str, root: str | Path | None = None) -> Path:
    """``base / name`` once ``name`` is a :func:`plain_name` and the path, resolved, is directly in
    ``base`` and inside ``root`` (default ``base``: the output the user named), so that no link on
    the way leads elsewhere; a UsageError otherwise."""
    path = Path(base) / plain_name(name, what, base)
    resolved = path.expanduser().resolve()
    top = Path(root if root is not None else base).expanduser().resolve()
    if resolved.parent != Path(base).expanduser().resolve() or not resolved.is_relative_to(top):
        raise UsageError(f"{what} {path} leads outside {root or base} (a symbolic link); remove the link")
    return path


def warn(message: str) -> None:
    """One warning line (``ssacli:0: RuntimeWarning: …``, no source line under it), for what ssacli
    skipped and why."""
    warnings.warn_explicit(message, RuntimeWarning, "ssacli", 0, module="ssacli", registry={})


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _set_mode(path: Path, mode: int, st: os.stat_result) -> None:
    """Give ``path`` (a regular file or folder, by ``st`` from lstat) ``mode``; a file with other
    links (one hard-linked from an earlier write) is copied and the copy renamed over it, so the
    mode of whatever else that inode is stays as it was."""
    if stat.S_IMODE(st.st_mode) == mode:
        return
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
        fd, copy = _make_temp(path)
        os.close(fd)
        shutil.copyfile(path, copy, follow_symlinks=False)
        os.chmod(copy, mode)
        os.replace(copy, path)
        return
    os.chmod(path, mode)


def publish(tmp: str | Path, path: str | Path, *, directory: bool = False) -> None:
    """Give a temp file (or a folder and what is in it) the permissions a plain create would
    have, then rename it into place. Nothing is followed: a symbolic link (or any entry neither a
    regular file nor a folder) inside a folder is dropped with one warning line, and a file with
    other hard links gets its mode on a copy (:func:`_set_mode`)."""
    tmp, mask = Path(tmp), _umask()
    if directory:
        for folder, names, files in os.walk(tmp):  # never into a linked folder
            for name in [*names, *files]:
                entry = Path(folder) / name
                st = entry.lstat()
                if stat.S_ISDIR(st.st_mode):  # a run's best/ stays searchable
                    _set_mode(entry, 0o777 & ~mask, st)
                elif stat.S_ISREG(st.st_mode):
                    _set_mode(entry, 0o666 & ~mask, st)
                else:
                    entry.unlink()
                    shown = Path(path) / entry.relative_to(tmp)
                    warn(f"not publishing {shown}: {_kind(st)}, which ssacli never writes through")
    _set_mode(tmp, (0o777 if directory else 0o666) & ~mask, tmp.lstat())
    os.replace(tmp, path)


def _kind(st: os.stat_result) -> str:
    return "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file or folder"


# ---- temp files: named after their writer ----------------------------------------------------------

_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
_TEMP = re.compile(r"\.(?P<name>.+)\.ssacli-(?P<host>[0-9a-f]{8})-(?P<pid>\d+)-[a-z0-9_]{8}")


def _make_temp(path: Path) -> tuple[int, Path]:
    """A new temp file beside ``path``, open for writing (mode 0600 until published), named
    ``.NAME.ssacli-HOST-PID-XXXXXXXX`` (HOST: a hash of the host name) so that the next write can
    tell a killed writer's leftover from anything else (:func:`remove_stale_temp_files`)."""
    prefix = f".{path.name}.ssacli-{_HOST}-{os.getpid()}-"
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=path.parent)
    return fd, Path(tmp)


def remove_stale_temp_files(path: str | Path) -> list[Path]:
    """Remove the temp files of ``path`` that writers killed mid-write left (:func:`_make_temp`):
    regular files, the current user's, named by a process of this host that has ended. Returns them."""
    path, removed = Path(path), []
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return removed
    for entry in entries:
        found = _TEMP.fullmatch(entry.name)
        if not found or found["name"] != path.name or found["host"] != _HOST:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and _pid_gone(int(found["pid"])):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
        except OSError:
            continue
    return removed


def write_fd(fd: int, data: bytes) -> None:
    """Write all of ``data`` to the open file ``fd`` and close it (every write of this module)."""
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def write_text(text: str, path: str | Path) -> None:
    """Write ``text`` to ``path`` whole or not at all (an OutputError says why not)."""
    write_bytes(text.encode("utf-8"), path)


def write_bytes(data: bytes, path: str | Path) -> None:
    """Write ``data`` to ``path`` whole or not at all (an OutputError says why not); a symbolic link
    at ``path`` is replaced, never written through."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temp_files(path)
        fd, tmp = _make_temp(path)
        write_fd(fd, data)
        publish(tmp, path)
    except OSError as err:
        raise output_error(path, err) from err
    finally:
        if tmp is not None and os.path.lexists(tmp):
            os.remove(tmp)


def json_text(data: Any) -> str:
    """How ssacli writes a JSON document (:func:`write_json`)."""
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def write_json(data: Any, path: str | Path) -> None:
    write_text(json_text(data), path)


def moved_aside(out: str | Path) -> Path:
    """Where :func:`replace_folder` moves the old ``out`` while the new one is renamed in."""
    out = Path(out)
    return out.with_name(f".{out.name}.old")


def replace_folder(tmp: str | Path, out: str | Path) -> None:
    """Rename the finished folder ``tmp`` to ``out``; an old ``out`` is moved aside first and put
    back if the rename fails or is interrupted, so ``out`` is always either old or new (or, after a
    kill between the two renames, old and moved aside: :func:`recover_moved_aside`)."""
    tmp, out = Path(tmp), Path(out)
    if not out.exists():
        publish(tmp, out, directory=True)
        return
    old = moved_aside(out)
    _remove_aside(old)
    out.rename(old)
    try:
        publish(tmp, out, directory=True)
    except BaseException:
        if not out.exists():
            old.rename(out)
        raise
    _remove_aside(old)


def _remove_aside(old: Path) -> None:
    """Remove what :func:`replace_folder` moved aside: a folder with what is in it, or a symbolic
    link (an OUT that was one) itself, never what it points to."""
    if old.is_symlink():
        old.unlink()
    else:
        shutil.rmtree(old, ignore_errors=True)


def recover_moved_aside(out: str | Path) -> None:
    """Finish what a writer killed inside :func:`replace_folder` left: ``.OUT.old`` (a real folder,
    the current user's) is put back where ``out`` is missing, and removed where ``out`` is there
    (the new one was in place). Anything else of that name is left alone."""
    out = Path(out).expanduser().absolute()
    old = moved_aside(out)
    try:
        st = old.lstat()
    except OSError:
        return
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return
    try:
        if os.path.lexists(out):
            shutil.rmtree(old)
        else:
            old.rename(out)
    except OSError as err:
        raise output_error(old, err) from err


# ---- one writer per output folder --------------------------------------------------------------------

_HELD: dict[
    Path, int
] = {}  # locks this process holds → how deeply (a job inside a job: convert, then finetune)
ABANDONED_AFTER_S = 2.0  # a lock this old that names no writer is a killed writer's, not one starting


def lock_path(out: str | Path) -> Path:
    """The lock of the output folder ``out``: a hidden file beside it (not inside: the folder is
    replaced whole by every checkpoint)."""
    out = Path(out).expanduser().absolute()
    return out.with_name(f".{out.name}.lock")


def _pid_gone(pid: int) -> bool:
    """Whether process ``pid`` of this host has ended (this process is never gone)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # alive, another user's
    return False


def _read_record(path: Path) -> dict | None:
    """The writer's record (JSON) in the regular file ``path``, read without following a symbolic
    link or waiting on anything else; None when it holds none (empty, unreadable, not a regular file).
    PermissionError where it cannot be opened (another user's)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except PermissionError:
        raise
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        record = json.loads(os.read(fd, 1 << 16))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return record if isinstance(record, dict) else None


def writer_gone(marker: Path) -> bool:
    """Whether the process named in ``marker`` (JSON with pid and host) has ended: only for a
    process of this host; a marker that cannot be read, another host's, or this process's own is
    never taken for gone."""
    try:
        writer = _read_record(marker) or {}
        pid, host = int(writer["pid"]), writer["host"]
    except (OSError, ValueError, TypeError, KeyError):
        return False
    if host != socket.gethostname():
        return False  # another machine's writer (a shared filesystem)
    return _pid_gone(pid)


def _lock_abandoned(path: Path) -> bool:
    """Whether the lock ``path`` may be taken over: its writer is gone (:func:`writer_gone`), or it
    names no writer at all (empty, unreadable, a symbolic link: a writer killed, or out of space,
    between making it and filling it) and is older than :data:`ABANDONED_AFTER_S`."""
    try:
        record = _read_record(path)
        if record is not None and "pid" in record:
            return writer_gone(path)
        return time.time() - path.lstat().st_mtime > ABANDONED_AFTER_S
    except OSError:
        return False


@contextmanager
def writer_lock(out: str | Path, option: str = "--out") -> Iterator[None]:
    """Hold the lock of the output folder ``out`` for the job inside: a second job asking for it
    (another process, on any host sharing the filesystem) is refused at once with a UsageError naming
    the writer, instead of running the whole job and failing at its first write. A lock left by a
    process of this host that has ended (SIGKILL, power loss), or one that names no writer
    (:func:`_lock_abandoned`), is taken over, and what a killed writer left beside ``out`` is
    finished (:func:`recover_moved_aside`); this process may nest.
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
        recover_moved_aside(out)
        yield
    finally:
        del _HELD[path]
        try:
            path.unlink()
        except OSError:
            pass


def _create_whole(path: Path, record: bytes) -> None:
    """Create the file ``path`` holding ``record``, never an empty or partial one: written to a temp
    file, then hard-linked in place (FileExistsError where ``path`` exists). Where the filesystem
    has no hard links, an exclusive create, removed again if the write fails."""
    fd, tmp = _make_temp(path)
    try:
        write_fd(fd, record)
        os.chmod(tmp, 0o644 & ~_umask())  # whoever finds it can read whose it is
        try:
            os.link(tmp, path)
            return
        except OSError as err:
            if err.errno not in _NO_HARD_LINKS:
                raise
    finally:
        os.unlink(tmp)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o644)
    try:
        write_fd(fd, record)
    except BaseException:
        os.unlink(path)
        raise


def _acquire(path: Path, out: Path, option: str) -> None:
    record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()})
    for _ in range(2):  # a second try after taking over a dead writer's lock
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            remove_stale_temp_files(path)
            _create_whole(path, record.encode())
        except FileExistsError:
            if _lock_abandoned(path):
                path.unlink(missing_ok=True)
                continue
            raise UsageError(_busy(path, out, option)) from None
        except OSError as err:
            raise output_error(out, err) from err
        return
    raise UsageError(_busy(path, out, option))


def _busy(path: Path, out: Path, option: str) -> str:
    try:
        writer = _read_record(path) or {}
        who = f"process {int(writer['pid'])} on {writer['host']}"
        since = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(writer["since"])))
        who += f" since {since}"
    except (OSError, ValueError, TypeError, KeyError):
        who = "another process"
    return (
        f"{option} {out} is being written by another ssacli job ({who}); wait for it to end or choose "
        f"another {option} (if no such job runs, delete {path})"
    )
