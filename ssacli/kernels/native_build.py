"""Building and loading ssacli's native kernels (ssacli.kernels.native calls them): the C sources, the
compiler, the flags and the per-machine cache; ssacli.kernels.native calls :func:`build` when a kernel
is first wanted, then :func:`load`.

The cache's file names are a hash anyone can compute, so a library is loaded only where no one else
could have written it (:func:`open_checked`): the file and the folders ssacli makes for it
(``kernels`` and the folder above it) are the current user's, not writable by group or others and not
symbolic links, checked on the open file and folders themselves (no gap between check and use). A
cache that fails the check is not used: the kernels are built into a private temporary folder of the
process, with one RuntimeWarning saying why. Builds write ``native-build-*.so`` temporary files,
removed when a build fails or is interrupted; one left by a killed process is removed by a later build
once it is an hour old.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import itertools
import os
import platform
import shlex
import shutil
import stat
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

# The C sources, compiled together into one library; the headers hold what they share: the math
# (native_math.h) and the argument structs of the entry points (native_abi.h, whose layout table
# native_abi.c exports for ssacli.kernels.native_abi to check).
SOURCES = tuple(Path(__file__).with_name(name) for name in ("native_stats.c", "native_ssa.c", "native_abi.c"))
HEADERS = tuple(
    Path(__file__).with_name(name) for name in ("native_math.h", "native_positions.h", "native_abi.h")
)
# -fopenmp links libgomp.so.1 by its soname, which resolves to the libgomp torch has already loaded:
# the row pass then runs on torch's own thread pool instead of competing with its spinning threads.
_FLAG_SETS = (
    ["-O3", "-march=native", "-fno-math-errno", "-fopenmp"],
    ["-O3", "-march=native", "-fno-math-errno"],  # no OpenMP (Apple clang): one thread
    ["-O3", "-fno-math-errno"],  # compilers that do not know -march=native
)
TEMP_PREFIX = "native-build-"  # a build's temporary file: native-build-XXXXXXXX.so
STALE_AFTER_S = 3600.0  # a temporary file this old is a killed build's, never one in flight
# Where there are owners and O_NOFOLLOW (not Windows), files and folders are checked before loading.
_CHECKED = hasattr(os, "geteuid") and hasattr(os, "O_NOFOLLOW")
_LOADS = itertools.count(1)  # libraries loaded by this process, for :func:`load`'s names


class UnsafeLibrary(Exception):
    """A cached library (or another file of ssacli's cache: the weight digests of
    ssacli.models.identity, checked the same way), or a folder holding it, that someone other than
    the current user could have written; ``path`` is the file or folder, ``reason`` why."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


def _flag_sets() -> list[list[str]]:
    """The flag sets tried in order, each followed by $SSACLI_NATIVE_CFLAGS (e.g. "-mno-avx512f" builds
    the AVX2 code paths on an AVX-512 machine; the tests use it to check every path they can)."""
    extra = shlex.split(os.environ.get("SSACLI_NATIVE_CFLAGS", ""))
    return [[*flags, *extra] for flags in _FLAG_SETS]


def cache_root() -> Path:
    """The folder ssacli makes for its cache: $SSACLI_CACHE, else $XDG_CACHE_HOME/ssacli, else
    ~/.cache/ssacli."""
    if os.environ.get("SSACLI_CACHE"):
        return Path(os.environ["SSACLI_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ssacli"


def cache_dir() -> Path:
    """Where built kernels live: the ``kernels`` folder of :func:`cache_root`."""
    return cache_root() / "kernels"


def compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cpu_signature() -> str:
    """What -march=native depends on: the CPU's model and feature flags where Linux says them."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        picked = [ln for ln in lines if ln.startswith(("model name", "flags", "Features"))]
        return "\n".join(dict.fromkeys(picked))
    except OSError:
        return platform.processor()


def target_path(compiler: str) -> Path:
    """The cached library for this compiler: named by a hash of the sources, the compiler's version,
    the CPU and the flags, so a new source or machine builds anew and nothing is overwritten in place."""
    source = b"\0".join(path.read_bytes() for path in (*HEADERS, *SOURCES))
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256(
        b"\0".join(s.encode() if isinstance(s, str) else s for s in
                   (source, version, platform.machine(), _cpu_signature(), repr(_flag_sets())))
    ).hexdigest()[:16]  # fmt: skip
    return cache_dir() / f"native-{key}.so"


def _refusal(st: os.stat_result, folder: bool) -> str | None:
    """Why a file or folder with this status could have been written by someone else; None: it could not."""
    if folder and not stat.S_ISDIR(st.st_mode):
        return "not a folder"
    if not folder and not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not you (uid {os.geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):#o})"
    return None


def _open_entry(name: str, dir_fd: int | None, shown: Path, folder: bool) -> int:
    """Open one file or folder (``name`` relative to ``dir_fd``) without following a symbolic link, and
    check what was opened; raises UnsafeLibrary, or OSError where it cannot be opened."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | (os.O_DIRECTORY if folder else 0)
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.EMLINK, errno.ENOTDIR):
            with contextlib.suppress(OSError):
                if stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                    raise UnsafeLibrary(shown, "a symbolic link") from None
        raise
    reason = _refusal(os.fstat(fd), folder)
    if reason is not None:
        os.close(fd)
        raise UnsafeLibrary(shown, reason)
    return fd


def _default_root(path: Path) -> Path:
    """The topmost folder checked for ``path``: :func:`cache_root` for a library in the cache, else
    the library's own folder (a private build's)."""
    return cache_root() if path.parent == cache_dir() else path.parent


def open_checked(path: Path, root: Path | None = None) -> int:
    """A read-only file descriptor of the library at ``path``, opened only if neither it nor a folder
    from ``root`` (default: :func:`cache_root` for a library in the cache, else the library's folder)
    down to its own could have been written by someone else: each is opened without following a
    symbolic link and its open descriptor checked (owned by the current user, not writable by group
    or others, a folder or a regular file), each opened relative to the one above, so nothing can be
    swapped in between. Raises UnsafeLibrary with the reason, FileNotFoundError where it is missing."""
    path = Path(path)
    if not _CHECKED:  # Windows: no owners or O_NOFOLLOW; the profile's cache is private by its ACL
        return os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    root = Path(root) if root is not None else _default_root(path)
    parts = path.parent.relative_to(root).parts
    fd = _open_entry(str(root), None, root, folder=True)
    try:
        shown = root
        for part in parts:
            shown = shown / part
            inner = _open_entry(part, fd, shown, folder=True)
            os.close(fd)
            fd = inner
        library = _open_entry(path.name, fd, path, folder=False)
    finally:
        os.close(fd)
    return library


def safe_to_load(path: Path, root: Path | None = None) -> str | None:
    """Why the library at ``path`` must not be loaded (see :func:`open_checked`), None if it may be."""
    try:
        os.close(open_checked(path, root))
    except UnsafeLibrary as err:
        return str(err)
    except OSError as err:
        return f"{path}: {err.strerror or err}"
    return None


def load(path: Path, root: Path | None = None) -> ctypes.CDLL:
    """The library at ``path``, loaded only after :func:`open_checked` and from the very file checked:
    on Linux through /proc/self/fd while the checked descriptor is open (elsewhere by its path)."""
    fd = open_checked(path, root)
    try:
        # dlopen hands back an object already loaded under the same name without opening anything,
        # and a closed descriptor's number comes back: a second library loaded as /proc/self/fd/N
        # would be the first one. Each load spells the path its own way (/proc/self/fd/./N, ...).
        by_fd = f"/proc/self/fd/{'./' * next(_LOADS)}{fd}"
        lib = ctypes.CDLL(by_fd if os.path.exists(by_fd) else str(path))
    finally:
        os.close(fd)
    lib._name = str(path)  # its repr names the file, not the descriptor it was loaded through
    return lib


def remove_stale(folder: Path, older_than: float = STALE_AFTER_S) -> list[Path]:
    """Remove the temporary files of builds killed mid-compile: regular files named
    ``native-build-*.so`` in ``folder``, the current user's, last written over ``older_than`` seconds
    ago (a build in flight writes its file within a minute). Nothing else is touched. Returns them."""
    removed: list[Path] = []
    now = time.time()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        if not (entry.name.startswith(TEMP_PREFIX) and entry.name.endswith(".so")):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if (
                stat.S_ISREG(st.st_mode)
                and (not _CHECKED or st.st_uid == os.geteuid())
                and now - st.st_mtime > older_than
            ):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
        except OSError:
            continue
    return removed


def _make_folders(root: Path, folder: Path) -> None:
    """Make the cache's folders; those ssacli makes (``root`` and ``folder`` in it) private to the user
    (0700, whatever the umask)."""
    root.parent.mkdir(parents=True, exist_ok=True)
    root.mkdir(mode=0o700, exist_ok=True)
    folder.mkdir(mode=0o700, exist_ok=True)


def build(compiler: str) -> Path:
    """The path of a library of the kernels for :func:`load`: the cached one where it exists and is
    safe (:func:`open_checked`), else built into the cache, or into a private temporary folder of the
    process where the cache cannot be written (silently: a read-only home) or fails the check (with a
    RuntimeWarning saying why)."""
    target = target_path(compiler)
    root = cache_root()
    try:
        _make_folders(root, target.parent)
        os.close(open_checked(target, root))
        return target
    except UnsafeLibrary as err:
        warnings.warn(
            f"ssacli: not loading native kernels from {err.path}: {err.reason}; building a private copy",
            RuntimeWarning,
            stacklevel=3,
        )
        return _compile(compiler, _private(target.name))
    except FileNotFoundError:
        pass  # not built yet
    except OSError:
        return _compile(compiler, _private(target.name))  # no cache folder can be made here
    if not os.access(target.parent, os.W_OK):
        return _compile(compiler, _private(target.name))
    remove_stale(target.parent)
    return _compile(compiler, target)


def _private(name: str) -> Path:
    """A path in a new private directory of this process (never a shared, predictable path another
    user could plant a library in); it is built again next time."""
    return Path(tempfile.mkdtemp(prefix="ssacli-kernels-")) / name


def _compile(compiler: str, target: Path) -> Path:
    """Compile the sources into ``target`` through a temporary file in its folder (renamed when whole,
    removed whatever stops the build), trying each flag set; raises RuntimeError with the last error."""
    errors = []
    for flags in _flag_sets():
        fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=".so", dir=target.parent)
        os.close(fd)
        try:
            run = subprocess.run(
                [compiler, *flags, "-shared", "-fPIC", "-o", tmp, *map(str, SOURCES), "-lm"],
                capture_output=True, text=True,
            )  # fmt: skip
            if run.returncode == 0:
                os.chmod(tmp, 0o700)  # the linker made it by the umask: private to the user
                os.replace(tmp, target)
                tmp = None
                return target
            errors.append((run.stderr.strip().splitlines() or [f"exit status {run.returncode}"])[-1])
        finally:
            if tmp is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
    raise RuntimeError(errors[-1])
