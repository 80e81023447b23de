"""Hostile folders (docs/faults.md, "Writes, caches and faults"): every writer of ssacli, given a
folder where a symbolic link leads to someone's private file, or a name with '..', writes only where
the user pointed; nothing in ssacli's cache that another user could have written is trusted.

The writers, one case each (symlink and '..'):

* ``ssacli.files.write_bytes`` / ``write_text`` / ``write_json``: every single-file output (--json,
  --html, --csv, --junit, check --init, a run's trajectory, a study's eval.json and results.json);
* ``ssacli.files.publish`` of a folder: every model or ICL folder (convert, finetune, train, icl train);
* ``best/`` (``ssacli.models.checkpoint._place_best``, carried over from the old OUT);
* ``stages/`` and other carried sub-folders (``_carry_folders``, the recipe);
* the writer lock ``.OUT.lock`` (``ssacli.files.writer_lock``);
* a study's run folders from a plan's labels (``ssacli.study.execute``: icl sweep, the LM study);
* figures (``ssacli.report.plots.save_figure``: icl eval --plot; ``figure_files``: --png/--svg);
* the weight-digest cache (``ssacli.models.identity``), read and written;
* the offload folders of --device-map (``ssacli.models.device_map.offload_folder``), removed only
  when they are the current user's real folders.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ssacli.errors import EXIT_USAGE, UsageError
from tests.helpers.cli import run_main

PRIVATE_TEXT = "someone's private notes\n"
OTHER_UID = 65534  # nobody: what another user's file looks like (the tests run as root, who can chown)


def private_file(tmp_path: Path) -> Path:
    """A 0600 file outside every folder ssacli writes: what a planted link points to."""
    target = tmp_path / "private" / "notes.txt"
    target.parent.mkdir(exist_ok=True)
    target.write_text(PRIVATE_TEXT)
    target.chmod(0o600)
    return target


def untouched(target: Path) -> bool:
    st = target.stat()
    return target.read_text() == PRIVATE_TEXT and stat.S_IMODE(st.st_mode) == 0o600 and st.st_nlink == 1


def tiny_model():
    from tests.helpers.models import build_model

    return build_model("llama", num_hidden_layers=1)


# ---- folders ssacli publishes -------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["best", "stages"])
def test_a_link_planted_in_a_carried_folder_is_dropped_and_its_target_untouched(where, tmp_path):
    """The issue's case: OUT/best/notes.txt links to a private 0600 file; the next checkpoint (a
    resumed finetune keeps OUT's best/, a recipe its stages/) neither changes that file's mode nor
    copies its content into OUT, and says so in one warning line."""
    from ssacli.models.checkpoint import write_model_folder

    model, out = tiny_model(), tmp_path / "out"
    write_model_folder(model, out, scorer="softmax", best="this")
    (out / "stages" / "transfer").mkdir(parents=True)
    target = private_file(tmp_path)
    planted = out / where / "notes.txt" if where == "best" else out / "stages" / "transfer" / "notes.txt"
    planted.symlink_to(target)
    with pytest.warns(RuntimeWarning, match="symbolic link") as caught:
        write_model_folder(model, out, scorer="softmax", best="keep", carry=("stages",))
    assert untouched(target)
    assert not os.path.lexists(planted)
    assert (out / "best" / "config.json").is_file() and (out / "stages" / "transfer").is_dir()
    assert all(len(str(w.message).splitlines()) == 1 for w in caught)


def test_publishing_a_folder_drops_a_link_inside_and_never_chmods_through_it(tmp_path):
    from ssacli.files import publish

    target = private_file(tmp_path)
    tmp = tmp_path / ".out.tmp"
    (tmp / "sub").mkdir(parents=True)
    (tmp / "weights.bin").write_bytes(b"w")
    (tmp / "sub" / "link").symlink_to(target)
    (tmp / "linked-dir").symlink_to(target.parent, target_is_directory=True)
    with pytest.warns(RuntimeWarning, match="symbolic link"):
        publish(tmp, tmp_path / "out", directory=True)
    assert untouched(target)
    assert sorted(p.name for p in (tmp_path / "out").rglob("*")) == ["sub", "weights.bin"]


def test_publishing_never_changes_the_mode_of_a_hard_linked_file(tmp_path):
    """A file carried over by a hard link (best/) gets its published mode on a copy: the other
    name of that inode keeps its mode."""
    from ssacli.files import publish

    target = private_file(tmp_path)
    tmp = tmp_path / ".out.tmp"
    tmp.mkdir()
    os.link(target, tmp / "notes.txt")
    publish(tmp, tmp_path / "out", directory=True)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600 and target.read_text() == PRIVATE_TEXT
    published = tmp_path / "out" / "notes.txt"
    assert published.read_text() == PRIVATE_TEXT and stat.S_IMODE(published.stat().st_mode) != 0o600


# ---- single files ----------------------------------------------------------------------------------------


def test_a_file_output_that_is_a_link_is_replaced_not_written_through(tmp_path, monkeypatch, capsys):
    """--json LINK: refused as a file ssacli did not write (docs/faults.md); with --overwrite the link
    is replaced by the result and the file it pointed to is as it was (a regression guard: ssacli's
    rename never followed the link)."""
    target = private_file(tmp_path)
    out = tmp_path / "r.json"
    out.symlink_to(target)
    args = ["diagnose", "builtin:every-softmax", "--probe", "outlier:1", "--samples", "1", "--length", "4"]
    code, _, stderr = run_main([*args, "--random", "--quiet", "--json", str(out)], monkeypatch, capsys)
    assert code == 2 and "--overwrite" in stderr and untouched(target) and out.is_symlink(), stderr
    args += ["--overwrite"]
    code, _, stderr = run_main([*args, "--random", "--quiet", "--json", str(out)], monkeypatch, capsys)
    assert code == 0, stderr
    assert untouched(target) and not out.is_symlink() and json.loads(out.read_text())


@pytest.mark.parametrize("writer", ["write_text", "save_figure"])
def test_file_writers_replace_a_link_and_keep_a_dotted_name_inside_its_folder(writer, tmp_path):
    """The low-level writers (every single-file output goes through write_bytes) and the figures:
    a link at the target is replaced, and a name with '..' that a figure's title gives stays a
    file name inside its folder. (Regression guards: these held before issue 50.)"""
    from ssacli.files import write_text
    from ssacli.report.figure_files import file_stem

    target = private_file(tmp_path)
    out = tmp_path / "out.png"
    out.symlink_to(target)
    if writer == "write_text":
        write_text("new\n", out)
    else:
        from matplotlib.figure import Figure

        from ssacli.report.plots import save_figure

        save_figure(Figure(figsize=(1, 1)), out)
    assert untouched(target) and not out.is_symlink() and out.stat().st_size > 0
    assert "/" not in file_stem("../../escape") and file_stem("../../escape") != ".."


# ---- the writer lock ------------------------------------------------------------------------------------


def test_a_lock_that_is_a_link_is_never_read_through_and_is_taken_over(tmp_path):
    """A planted .OUT.lock linking to a private file names no writer: once it is older than a
    moment it is taken over (the link removed, the file untouched), never read through."""
    from ssacli.files import lock_path, writer_lock

    target = private_file(tmp_path)
    out = tmp_path / "out"
    lock = lock_path(out)
    lock.symlink_to(target)
    old = target.stat().st_mtime - 60  # a moment ago is not old enough: a writer may be filling it
    os.utime(lock, (old, old), follow_symlinks=False)
    with writer_lock(out):
        assert not lock.is_symlink() and json.loads(lock.read_text())["pid"] == os.getpid()
    assert untouched(target) and not os.path.lexists(lock)


# ---- names from a plan --------------------------------------------------------------------------------


def test_icl_sweep_refuses_an_arm_label_that_leaves_out(tmp_path, monkeypatch, capsys):
    """The issue's case: an arm label x/../../../../ESCAPED/arm would have put a run's folder
    outside --out; it is refused in one line before anything is written."""
    out = tmp_path / "d1" / "d2" / "sweep"
    plan = {
        "tasks": ["every"], "steps": 2, "batch_size": 4, "prompts": 4, "sigmas": [1], "lengths": [5],
        "outliers": [], "scorers": [{"label": "x/../../../../ESCAPED/arm", "spec": "softmax", "seeds": 1}],
    }  # fmt: skip
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan))
    args = ["icl", "sweep", "--plan", str(plan_file), "--out", str(out)]
    code, _, stderr = run_main(args, monkeypatch, capsys)
    assert code == EXIT_USAGE, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "arm label" in lines[0] and "Traceback" not in stderr
    assert not (tmp_path / "d1" / "ESCAPED").exists() and not out.exists()


@pytest.mark.parametrize("name", ["../escaped", "a/b", "..", "", "x\\y"])
def test_a_study_refuses_run_names_and_labels_that_are_not_plain(name, tmp_path):
    from ssacli.study import StudyRun, check_arms, execute

    def work(run, folder):
        folder.mkdir(parents=True)
        return {}

    with pytest.raises(UsageError, match="plain name"):
        check_arms([name, "ok"], None)
    with pytest.raises(UsageError, match="plain name"):
        execute([StudyRun(name, "a", 0)], tmp_path / "out", work)
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("linked", ["runs/a-s0", "runs"])
def test_a_study_refuses_a_run_folder_that_links_out(linked, tmp_path):
    """A run's folder, or OUT/runs itself, that is a link leading out of OUT is refused."""
    from ssacli.study import StudyRun, execute

    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "a-s0").mkdir(parents=True)
    (tmp_path / "out").mkdir()
    if linked == "runs":
        (tmp_path / "out" / "runs").symlink_to(elsewhere, target_is_directory=True)
    else:
        (tmp_path / "out" / "runs").mkdir()
        (tmp_path / "out" / linked).symlink_to(elsewhere / "a-s0", target_is_directory=True)
    with pytest.raises(UsageError, match="leads outside"):
        execute([StudyRun("a-s0", "a", 0)], tmp_path / "out", lambda run, folder: {"x": 1})
    assert list((elsewhere / "a-s0").iterdir()) == []


# ---- ssacli's cache ------------------------------------------------------------------------------------


def _record(folder: Path, monkeypatch) -> dict:
    """The weights record diagnose would keep for ``folder``, with a fresh warning state."""
    from ssacli.models import identity

    monkeypatch.setattr(identity, "_WARNED", set(), raising=False)
    return identity.content_record(folder)


@pytest.fixture
def weights(tmp_path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"the weights")
    return folder


def _forged(cache: Path, folder: Path, monkeypatch) -> Path:
    """The digest cache with an entry for ``folder`` that says 64 zeros (what the tester planted)."""
    from ssacli.models import identity

    monkeypatch.setenv("SSACLI_CACHE", str(cache))
    truth = _record(folder, monkeypatch)["sha256"]
    path = cache / identity.CACHE_FILE
    entries = json.loads(path.read_text())
    path.write_text(json.dumps({key: "0" * 64 for key in entries}))
    assert _record(folder, monkeypatch)["sha256"] == "0" * 64  # the user's own cache is believed
    return truth


@pytest.mark.parametrize("how", ["other-owner", "world-writable-file", "symlink", "shared-1777-folder"])
def test_a_digest_cache_someone_else_could_have_written_is_ignored_with_one_warning(
    how, weights, tmp_path, monkeypatch
):
    """The issue's case (a 1777 SSACLI_CACHE holding a weights-sha256.json of uid 65534 that maps
    the model to 64 zeros) and each condition alone: the digest is measured again and one warning
    line says why. In the user's own private folder the file is replaced by a private one (a link:
    the link itself, its target untouched); in a shared folder nothing is written."""
    from ssacli.models import identity

    cache = tmp_path / "cache"
    truth = _forged(cache, weights, monkeypatch)
    path = cache / identity.CACHE_FILE
    planted = tmp_path / "planted.json"
    if how == "other-owner":
        os.chown(path, OTHER_UID, OTHER_UID)
    elif how == "world-writable-file":
        path.chmod(0o666)
    elif how == "symlink":
        path.rename(planted)
        path.symlink_to(planted)
    else:
        cache.chmod(0o1777)
        os.chown(path, OTHER_UID, OTHER_UID)
    before = path.read_bytes()
    with pytest.warns(RuntimeWarning, match="ignoring ssacli's cache") as caught:
        record = _record(weights, monkeypatch)
    assert record["sha256"] == truth
    assert len(caught) == 1 and len(str(caught[0].message).splitlines()) == 1
    if how == "shared-1777-folder":
        assert path.read_bytes() == before
    else:
        st = path.lstat()
        assert stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o600
        from ssacli.kernels.native_build import safe_to_load

        assert safe_to_load(path, cache) is None  # the next read trusts it
        if how == "symlink":
            assert planted.read_bytes() == before


def test_diagnose_records_the_measured_digest_under_a_planted_cache(weights, tmp_path, monkeypatch, capsys):
    """End to end: diagnose --json under the issue's hostile cache records the real sha256."""
    from ssacli.models import identity
    from tests.helpers.models import build_model

    model_dir = tmp_path / "llama"
    build_model("llama", num_hidden_layers=1).save_pretrained(model_dir)
    monkeypatch.setenv("SSACLI_BACKEND", "torch-blocks")  # the kernels would refuse this cache too
    cache = tmp_path / "cache"
    truth = _forged(cache, model_dir, monkeypatch)
    cache.chmod(0o1777)
    os.chown(cache / identity.CACHE_FILE, OTHER_UID, OTHER_UID)
    monkeypatch.setattr(identity, "_WARNED", set(), raising=False)
    out = tmp_path / "r.json"
    args = ["diagnose", str(model_dir), "--probe", "outlier:1", "--samples", "1", "--length", "4", "--random"]
    with pytest.warns(RuntimeWarning, match="ignoring ssacli's cache"):
        code, _, stderr = run_main([*args, "--quiet", "--json", str(out)], monkeypatch, capsys)
    assert code == 0, stderr
    assert json.loads(out.read_text())["weights"]["sha256"] == truth


def test_stale_offload_folders_of_other_users_and_links_are_left_alone(tmp_path, monkeypatch):
    """--device-map's clean-up of dead processes' offload folders in the shared temp folder removes
    only the current user's real folders."""
    import tempfile

    from ssacli.models import device_map

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    pid = int(dead.stdout)
    prefix = device_map.OFFLOAD_PREFIX
    mine, theirs = tmp_path / f"{prefix}{pid}-mine", tmp_path / f"{prefix}{pid}-theirs"
    mine.mkdir(), theirs.mkdir()
    os.chown(theirs, OTHER_UID, OTHER_UID)
    victim = private_file(tmp_path)
    (tmp_path / f"{prefix}{pid}-link").symlink_to(victim.parent, target_is_directory=True)
    fresh = device_map.offload_folder()
    assert not mine.exists() and theirs.is_dir() and untouched(victim)
    fresh.rmdir()


def test_replacing_an_out_that_is_a_link_never_touches_what_it_points_to(tmp_path):
    """replace_folder (every checkpoint write) on an OUT that is a symbolic link: the link is
    replaced by the new folder, the folder it pointed to and its private file stay as they were, and
    no .OUT.old is left behind."""
    from ssacli.files import replace_folder

    target = private_file(tmp_path)
    out = tmp_path / "out"
    out.symlink_to(target.parent, target_is_directory=True)
    new = tmp_path / "new"
    new.mkdir()
    (new / "ssacli.json").write_text("{}")
    replace_folder(new, out)
    assert untouched(target) and not out.is_symlink() and (out / "ssacli.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "private"]


def test_sweep_figures_named_from_a_results_file_stay_in_their_folder(tmp_path):
    """plot_sweep names its files after the plan's tasks (read back from a results.json): a task
    with '/' or '..' is refused before any figure is drawn."""
    from ssacli.report.plots import plot_sweep

    row = {"task": "../../escaped", "arch": "gpt2", "metric": "error", "outlier": None, "sigma": 1,
           "length": 5, "label": "a", "mean": 0.5, "std": None, "seeds": 1, "values": [0.5],
           "seed_ids": [0]}  # fmt: skip
    summary = {"aggregate": [row], "paired": [], "plan": {"tasks": ["../../escaped"], "points_end": 5}}
    with pytest.raises(UsageError, match="plain name"):
        plot_sweep(summary, tmp_path / "a" / "figures")
    assert sorted(p.name for p in tmp_path.rglob("*")) == []


def test_the_digest_cache_ssacli_writes_passes_its_own_check_under_umask_002(weights, tmp_path, monkeypatch):
    """A user whose umask lets the group write (002) still gets a cache the next read trusts: the
    digest file is written private, the folder made 0700."""
    import warnings

    from ssacli.models import identity

    monkeypatch.setenv("SSACLI_CACHE", str(tmp_path / "cache"))
    previous = os.umask(0o002)
    try:
        first = _record(weights, monkeypatch)
    finally:
        os.umask(previous)
    path = tmp_path / "cache" / identity.CACHE_FILE
    assert stat.S_IMODE(path.stat().st_mode) & 0o022 == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _record(weights, monkeypatch) == first
