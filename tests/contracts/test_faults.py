"""Faults end in one true line (docs/faults.md, "Writes, caches and faults"): a full disk anywhere is
exit 4 naming the path and leaves no lock; what a killed writer left (an empty lock, ``.OUT.old``,
its temp files) is taken over, reused or removed by the next run, and nothing ssacli cannot prove
it wrote is touched; a SIGTERM once the outputs are complete leaves exit 0.

A full disk is simulated in-process (the write ssacli makes raises ENOSPC); a real process is
started only where a real signal is the point (SIGKILL mid-publish, SIGTERM at shutdown).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ssacli.errors import EXIT_INPUT, EXIT_USAGE
from tests.helpers.cli import run_main
from tests.helpers.faults import full_disk

ROOT = Path(__file__).resolve().parents[2]
CONVERT = ["convert", "builtin:every-softmax", "--scorer", "ssa"]
DIAGNOSE = ["diagnose", "builtin:every-softmax", "--probe", "outlier:1", "--samples", "1", "--length", "4"]
ICL_TRAIN = ["icl", "train", "--task", "every", "--steps", "2", "--checkpoint-every", "1", "--device", "cpu",
             "--layers", "1", "--heads", "1", "--width", "8", "--batch-size", "4"]  # fmt: skip


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip() and "%|" not in line]
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in stderr, stderr
    return lines[0]


def beside(folder: Path, name: str) -> list[str]:
    """What ssacli keeps or leaves beside ``name`` in ``folder``: its lock, temp files, .old."""
    return sorted(p.name for p in folder.glob(f".{name}.*"))


def in_a_killed_process(code: str, *args: str) -> None:
    """Run ``code`` in a fresh Python that ends by SIGKILL (what it leaves is the point)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=env, capture_output=True)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()


# ---- a full disk ----------------------------------------------------------------------------------------


def test_a_full_disk_while_taking_the_lock_is_exit_4_and_leaves_no_lock(tmp_path, monkeypatch, capsys):
    """The issue's case: ENOSPC writing .OUT.lock was `internal error: OSError` (exit 1) and left an
    empty lock that refused the next run. Now: exit 4 naming OUT, nothing left, the next run works."""
    out = tmp_path / "out"
    full_disk(monkeypatch, name_holds=".out.lock")
    code, _, stderr = run_main([*CONVERT, "--out", str(out)], monkeypatch, capsys)
    line = one_error_line(stderr)
    assert code == EXIT_INPUT and str(out) in line and "No space left on device" in line
    assert beside(tmp_path, "out") == [] and not out.exists()
    monkeypatch.undo()
    code, _, stderr = run_main([*CONVERT, "--out", str(out)], monkeypatch, capsys)
    assert code == 0, stderr


def test_a_full_disk_while_writing_the_checkpoint_is_exit_4_and_leaves_no_lock(tmp_path, monkeypatch, capsys):
    """ENOSPC inside the model folder (a regression guard: exit 4 held before issue 50; the lock and
    every temp file go too)."""
    out = tmp_path / "out"

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("ssacli.models.checkpoint.save_file", full)
    code, _, stderr = run_main([*CONVERT, "--out", str(out)], monkeypatch, capsys)
    line = one_error_line(stderr)
    assert code == EXIT_INPUT and str(out) in line and "No space left on device" in line
    assert beside(tmp_path, "out") == [] and not out.exists()


# ---- what a killed writer left ---------------------------------------------------------------------------


def test_an_empty_lock_a_killed_writer_left_is_taken_over(tmp_path, monkeypatch, capsys):
    """An empty .OUT.lock (a writer killed, or out of space, between creating and filling it) names no
    writer: a moment after it was made it is still respected, once it is old it is taken over."""
    out = tmp_path / "out"
    lock = tmp_path / ".out.lock"
    lock.write_text("")
    code, _, stderr = run_main([*CONVERT, "--out", str(out)], monkeypatch, capsys)
    assert code == EXIT_USAGE and "being written by another ssacli job" in one_error_line(stderr)
    past = time.time() - 60
    os.utime(lock, (past, past))
    code, _, stderr = run_main([*CONVERT, "--out", str(out)], monkeypatch, capsys)
    assert code == 0, stderr
    assert (out / "ssacli.json").is_file() and beside(tmp_path, "out") == []


KILL_AT_THE_RENAME = """
    import os, signal, sys
    from pathlib import Path
    from ssacli import files

    out = Path(sys.argv[1])
    new = out.with_name("new-folder")
    new.mkdir()
    (new / "x").write_text("a half-published checkpoint")
    files.publish = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)
    files.replace_folder(new, out)  # moves out aside to .out.old, then dies before the rename
"""


def test_a_kill_at_the_publishing_rename_leaves_old_that_the_next_run_resumes(tmp_path, monkeypatch, capsys):
    """SIGKILL between moving OUT aside and renaming the new folder in: OUT is missing and .OUT.old
    holds the last checkpoint. The next `--resume` puts it back and continues it (the recorded
    training time carries on from it), and no .OUT.old is left."""
    out = tmp_path / "run"
    code, _, stderr = run_main([*ICL_TRAIN, "--out", str(out)], monkeypatch, capsys)
    assert code == 0, stderr
    meta = json.loads((out / "ssacli.json").read_text())
    meta["training"]["seconds"] = 12345.0  # a mark only the kept checkpoint carries
    (out / "ssacli.json").write_text(json.dumps(meta))
    in_a_killed_process(KILL_AT_THE_RENAME, str(out))
    assert not out.exists() and (tmp_path / ".run.old").is_dir()
    args = [*ICL_TRAIN, "--out", str(out), "--resume"]
    args[args.index("--steps") + 1] = "3"
    code, _, stderr = run_main(args, monkeypatch, capsys)
    assert code == 0, stderr
    training = json.loads((out / "ssacli.json").read_text())["training"]
    assert training["step"] == 3 and training["seconds"] >= 12345.0
    assert beside(tmp_path, "run") == []


KILL_WHILE_PUBLISHING = """
    import os, signal, sys
    from ssacli import files

    files.publish = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)
    files.write_text("{}", sys.argv[1])  # the temp file is whole, the rename never comes
"""


def test_temp_files_a_killed_writer_left_are_removed_and_nothing_else(tmp_path, monkeypatch, capsys):
    """SIGKILL while publishing r.json leaves its temp file; the next write of r.json removes it. A
    file ssacli cannot prove it wrote (another name pattern, another owner, a live writer's, a
    symbolic link) stays."""
    out = tmp_path / "r.json"
    in_a_killed_process(KILL_WHILE_PUBLISHING, str(out))
    left = beside(tmp_path, "r.json")
    assert len(left) == 1 and not out.exists()
    mine = tmp_path / left[0]
    dead = mine.name[:-8]  # .r.json.ssacli-HOST-PID-: the killed writer's prefix
    live = dead.replace(f"-{dead.split('-')[-2]}-", f"-{os.getpid()}-")
    keep = [tmp_path / ".r.json.abcd1234", tmp_path / f"{live}abcd1234"]
    for path in keep:
        path.write_text("not ssacli's to remove")
    theirs = tmp_path / f"{dead}zzzzzzzz"
    theirs.write_text("another user's")
    os.chown(theirs, 65534, 65534)
    link = tmp_path / f"{dead}llllllll"
    link.symlink_to(tmp_path / "elsewhere")
    code, _, stderr = run_main([*DIAGNOSE, "--random", "--quiet", "--json", str(out)], monkeypatch, capsys)
    assert code == 0, stderr
    assert not mine.exists() and json.loads(out.read_text())
    assert all(path.exists() for path in keep) and theirs.exists() and link.is_symlink()


# ---- a signal once the work is done -----------------------------------------------------------------------


SIGTERM_AT_SHUTDOWN = """
    import atexit, os, signal, sys
    # registered first, so it runs last: the command is over and Python is shutting down
    atexit.register(lambda: os.kill(os.getpid(), signal.SIGTERM))
    from ssacli.cli import main

    sys.argv = ["ssacli", *sys.argv[1:]]
    main()
"""


@pytest.mark.parametrize("args, code", [(["scorers"], 0), (["diagnose", "./no-such-folder"], EXIT_INPUT)])
def test_a_sigterm_after_the_command_ended_keeps_its_exit_code(args, code, tmp_path):
    """A SIGTERM that arrives once the outputs are complete (torch and Python still shutting down) ends
    the process with the command's own exit code, not 143."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-c", textwrap.dedent(SIGTERM_AT_SHUTDOWN), *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == code, (done.returncode, done.stderr)


def test_a_leftover_old_folder_beside_a_complete_out_is_removed_and_nothing_else(tmp_path):
    """.OUT.old beside a complete OUT (a kill after the new folder was renamed in) goes with the next
    job's lock; one that is a link, or another user's, is not ssacli's to remove."""
    from ssacli.files import writer_lock

    for name, make in [("mine", None), ("link", "link"), ("theirs", "chown")]:
        out = tmp_path / name
        out.mkdir()
        old = tmp_path / f".{name}.old"
        if make == "link":
            (tmp_path / "target").mkdir(exist_ok=True)
            old.symlink_to(tmp_path / "target", target_is_directory=True)
        else:
            old.mkdir()
            (old / "ssacli.json").write_text("{}")
            if make == "chown":
                os.chown(old, 65534, 65534)
        with writer_lock(out):
            pass
        assert os.path.lexists(old) == (make is not None), name
    assert (tmp_path / "target").is_dir()
