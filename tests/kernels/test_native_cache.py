"""The native-kernel cache is loaded only where no one else could have written it
(ssacli.kernels.native_build.open_checked): a library owned by another user, a symbolic link, or a
folder of the cache writable by group or others is refused with one warning and the kernels are built
privately; the planted library's constructor, which would create a marker file, never runs. Builds
leave no temporary file behind, and a killed build's is removed once it is stale.

Most tests build with a stand-in compiler (a script that links a tiny library wherever the build asks,
so the cache logic runs in full in milliseconds); two build the real kernels in a fresh process."""

from __future__ import annotations

import ctypes
import json
import os
import re
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from ssacli.kernels import native_build

CC = native_build.compiler()
pytestmark = [
    pytest.mark.skipif(not hasattr(os, "geteuid"), reason="no file owners here (Windows)"),
    pytest.mark.skipif(CC is None, reason="no C compiler ($CC, cc, gcc or clang)"),
]


def _compile(tmp_path: Path, name: str, source: str) -> Path:
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    out = tmp_path / f"{name}.so"
    subprocess.run([CC, "-shared", "-fPIC", "-o", str(out), str(src)], check=True, capture_output=True)
    out.chmod(0o700)
    return out


def _planted(tmp_path: Path) -> tuple[Path, Path]:
    """Someone's library whose constructor creates a marker file as soon as it is loaded: (the
    library, the marker)."""
    marker = tmp_path / "planted-library-ran"
    source = (
        "#include <stdio.h>\n"
        "__attribute__((constructor)) static void planted(void) {\n"
        f'    FILE *f = fopen({json.dumps(str(marker))}, "w"); if (f) fclose(f);\n'
        "}\n"
    )
    return _compile(tmp_path, "planted", source), marker


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """A stand-in compiler that links a harmless library (``ssacli_stand_in`` returns 42) at whatever
    -o path the build gives it and logs that path; SSACLI_CACHE is a fresh folder under tmp_path, and
    private builds go under tmp_path too. Returns (compiler, log)."""
    harmless = tmp_path / "harmless.c"
    harmless.write_text("int ssacli_stand_in(void) { return 42; }\n")
    log = tmp_path / "stand-in.log"
    script = tmp_path / "stand-in-cc"
    script.write_text(
        "#!/bin/sh\n"
        'out=""; prev=""\n'
        'for arg in "$@"; do [ "$prev" = "-o" ] && out="$arg"; prev="$arg"; done\n'
        '[ -n "$out" ] || { echo "stand-in compiler 1.0"; exit 0; }\n'
        f'echo "$out" >> "{log}"\n'
        f'exec "{CC}" -shared -fPIC -o "$out" "{harmless}"\n'
    )
    script.chmod(0o700)
    monkeypatch.setenv("SSACLI_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return str(script), log


def _cache_folders(target: Path) -> None:
    target.parent.parent.mkdir(mode=0o700)
    target.parent.mkdir(mode=0o700)


def _plant_at_target(target: Path, tmp_path: Path) -> Path:
    """The planted library at the cache's exact path, in the user's own 0700 folders; its marker."""
    _cache_folders(target)
    planted, marker = _planted(tmp_path)
    target.write_bytes(planted.read_bytes())
    target.chmod(0o700)
    return marker


def _built(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def _refused_end_to_end(compiler: str, log: Path, target: Path, marker: Path, shown: Path, why: str):
    """The checks refuse ``target`` naming ``shown`` and ``why``, :func:`load` raises, and a build warns
    once and builds a private copy that does load; the planted library never ran."""
    reason = native_build.safe_to_load(target)
    assert reason is not None and str(shown) in reason and why in reason
    with pytest.raises(native_build.UnsafeLibrary, match=re.escape(why)):
        native_build.load(target)
    with pytest.warns(RuntimeWarning) as seen:
        built = native_build.build(compiler)
    messages = [str(w.message) for w in seen if "native kernels" in str(w.message)]
    assert len(messages) == 1
    assert f"not loading native kernels from {shown}: " in messages[0] and why in messages[0]
    assert "building a private copy" in messages[0]
    assert built != target and built.parent.name.startswith("ssacli-kernels-")
    assert _built(log) and all(Path(p).parent == built.parent for p in _built(log))
    assert native_build.load(built).ssacli_stand_in() == 42
    assert not marker.exists(), "the planted library was loaded"


def test_a_library_owned_by_another_user_is_refused_and_never_loaded(stand_in, tmp_path, monkeypatch):
    """The library at the cache's exact path belongs to another user (as os.fstat reports the opened
    file: changing an owner needs root), everything else is the user's: refused by its owner, the
    kernels built privately, the library's constructor never run. With the effective uid changed
    instead, the cache's own folder is refused by the same comparison."""
    compiler, log = stand_in
    target = native_build.target_path(compiler)
    marker = _plant_at_target(target, tmp_path)
    planted_id = (target.stat().st_dev, target.stat().st_ino)
    other = os.geteuid() + 1
    real_fstat = os.fstat

    def fstat(fd):
        st = real_fstat(fd)
        if (st.st_dev, st.st_ino) != planted_id:
            return st
        fields = list(st)
        fields[4] = other  # st_uid
        return os.stat_result(fields)

    with monkeypatch.context() as patched:
        patched.setattr(os, "fstat", fstat)
        _refused_end_to_end(compiler, log, target, marker, target, f"owned by uid {other}, not you")

    with monkeypatch.context() as patched:
        me = os.geteuid()
        patched.setattr(os, "geteuid", lambda: me + 7)
        reason = native_build.safe_to_load(target)
        assert reason is not None and f"owned by uid {me}, not you (uid {me + 7})" in reason
    assert native_build.safe_to_load(target) is None  # as it is: the user's own file
    assert not marker.exists()
    ctypes.CDLL(str(target))
    assert marker.exists(), "the planted library's constructor should have run when loaded"


@pytest.mark.parametrize("where", ["library", "folder"])
def test_a_symbolic_link_in_the_cache_is_refused(stand_in, tmp_path, where):
    """A symbolic link at the library's exact path, or the cache's kernels folder a symbolic link to a
    folder holding it, pointing at a library that is otherwise the user's: refused, built privately,
    never loaded."""
    compiler, log = stand_in
    target = native_build.target_path(compiler)
    planted, marker = _planted(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (elsewhere / target.name).write_bytes(planted.read_bytes())
    (elsewhere / target.name).chmod(0o700)
    target.parent.parent.mkdir(mode=0o700)
    if where == "library":
        target.parent.mkdir(mode=0o700)
        target.symlink_to(elsewhere / target.name)
        shown = target
    else:
        target.parent.symlink_to(elsewhere, target_is_directory=True)
        shown = target.parent
    _refused_end_to_end(compiler, log, target, marker, shown, "a symbolic link")


@pytest.mark.parametrize(
    "where, mode",
    [("kernels", 0o777), ("root", 0o770), ("library", 0o666)],
    ids=["kernels-folder-0777", "cache-folder-0770", "library-0666"],
)
def test_a_cache_writable_by_others_is_refused(stand_in, tmp_path, where, mode):
    """The cache's kernels folder world-writable, the folder above it group-writable, or the library
    itself writable by others (all the user's own): refused, built privately, never loaded."""
    compiler, log = stand_in
    target = native_build.target_path(compiler)
    marker = _plant_at_target(target, tmp_path)
    shown = {"kernels": target.parent, "root": target.parent.parent, "library": target}[where]
    shown.chmod(mode)
    _refused_end_to_end(compiler, log, target, marker, shown, f"writable by group or others (mode {mode:#o})")


def test_a_build_removes_stale_temporary_files_and_keeps_the_rest(stand_in):
    """A killed build's 0-byte native-build-*.so, two hours old, is removed by the next build; one just
    written (a build in flight) stays, as do files ssacli did not write (another name, however old).
    The build leaves no temporary file of its own and its library is private to the user."""
    compiler, log = stand_in
    target = native_build.target_path(compiler)
    _cache_folders(target)
    folder = target.parent
    old = time.time() - 2 * native_build.STALE_AFTER_S
    stale, fresh, foreign = (
        folder / "native-build-k1ll3d.so",
        folder / "native-build-1nfl1t.so",
        folder / "tmpab12cd.so",
    )
    for path in (stale, fresh, foreign):
        path.write_bytes(b"")
    for path in (stale, foreign):
        os.utime(path, (old, old))
    assert native_build.build(compiler) == target
    assert len(_built(log)) == 1 and Path(_built(log)[0]).name.startswith("native-build-")
    assert not stale.exists() and fresh.exists() and foreign.exists()
    assert sorted(p.name for p in folder.iterdir()) == sorted([target.name, fresh.name, foreign.name])
    assert stat.S_IMODE(target.stat().st_mode) & 0o077 == 0
    assert native_build.load(target).ssacli_stand_in() == 42
    assert native_build.build(compiler) == target and len(_built(log)) == 1  # cached: no rebuild


def test_libraries_loaded_one_after_another_are_each_their_own(tmp_path):
    """load() opens each library through /proc/self/fd/N and closes the descriptor after, so the next
    load gets the same N; dlopen hands back an object it already has under the same name, so each load
    must name its descriptor its own way or a second library would be the first one (as a test's
    stand-in would be the real kernels)."""
    first = _compile(tmp_path, "first", "int ssacli_which(void) { return 1; }\n")
    second = _compile(tmp_path, "second", "int ssacli_which(void) { return 2; }\n")
    assert [native_build.load(path).ssacli_which() for path in (first, second, first)] == [1, 2, 1]


def test_a_failed_or_interrupted_build_leaves_no_temporary_file(stand_in, tmp_path, monkeypatch):
    """A compiler that writes part of its output and fails, and a build interrupted by Ctrl-C while
    the compiler runs: nothing is left in the cache's folder."""
    compiler, _ = stand_in
    failing = tmp_path / "failing-cc"
    failing.write_text(
        "#!/bin/sh\n"
        'out=""; prev=""\n'
        'for arg in "$@"; do [ "$prev" = "-o" ] && out="$arg"; prev="$arg"; done\n'
        '[ -n "$out" ] || { echo "failing compiler 1.0"; exit 0; }\n'
        'echo half > "$out"; echo "error: no" >&2; exit 1\n'
    )
    failing.chmod(0o700)
    with pytest.raises(RuntimeError, match="error: no"):
        native_build.build(str(failing))
    folder = native_build.cache_dir()
    assert folder.is_dir() and not list(folder.iterdir())

    real_run = subprocess.run

    def interrupted(args, **kwargs):
        if "-o" not in args:
            return real_run(args, **kwargs)
        Path(args[args.index("-o") + 1]).write_bytes(b"half a library")
        raise KeyboardInterrupt

    monkeypatch.setattr(native_build.subprocess, "run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        native_build.build(compiler)
    assert not list(folder.iterdir())


SCRIPT = r"""
import os, sys, warnings
os.umask(0)  # whatever the umask, what the build writes is the user's alone
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    from ssacli.kernels import native
    lib = native.library()
    print(native.available(), lib and lib.cdll._name)
    print(sum("native kernels" in str(w.message) for w in seen))
    for w in seen:
        print(w.message, file=sys.stderr)
"""


def _run(tmp_path: Path, cache: Path) -> list[str]:
    env = {**os.environ, "SSACLI_CACHE": str(cache), "TMPDIR": str(tmp_path)}
    env.pop("SSACLI_BACKEND", None)  # the build is the point, whatever the caller's setting
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


def test_the_users_own_build_is_built_private_and_loaded_again_without_a_rebuild(tmp_path, monkeypatch):
    """The real kernels (umask 0): built into the cache with its folders 0700 and the library 0700;
    a second process loads that same file (unchanged: no rebuild) with no warning."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("SSACLI_CACHE", str(cache))
    target = native_build.target_path(CC)
    assert _run(tmp_path, cache) == ["True", str(target), "0"]
    for path in (cache, target.parent, target):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    before = target.stat()
    assert _run(tmp_path, cache) == ["True", str(target), "0"]
    after = target.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]


def test_native_library_refuses_a_world_writable_cache_end_to_end(tmp_path, monkeypatch):
    """ssacli.kernels.native.library() in a fresh process, the cache folder world-writable and a
    library planted at the exact path the build would use: one warning naming the folder, the real
    kernels built privately and used, the planted library never loaded."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("SSACLI_CACHE", str(cache))
    target = native_build.target_path(CC)
    marker = _plant_at_target(target, tmp_path)
    cache.chmod(0o777)
    available, name, warned = _run(tmp_path, cache)
    assert (available, warned) == ("True", "1")
    assert Path(name).parent.name.startswith("ssacli-kernels-") and Path(name).name == target.name
    assert not marker.exists(), "the planted library was loaded"
