"""Hub ids the way transformers reads them (ssacli/models/hub.py), offline, against a Hugging Face
cache the tests build: ``models--ssacli-test--tiny/snapshots/<commit>/`` holding a tiny llama saved
from its config, ``refs/main`` and ``refs/v2`` naming two commits with different weights.

The suite runs with HF_HUB_OFFLINE=1 (tests/conftest.py); the tests of the online path turn it off and
replace huggingface_hub's one request (get_hf_file_metadata) by its answer, or by the connection
error a machine without a network gets: no test sends a packet.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import huggingface_hub
import pytest
import torch
from huggingface_hub import constants

from ssacli.errors import EXIT_INPUT, EXIT_USAGE, InputError, UsageError
from ssacli.models.hub import FETCHED, split_revision
from ssacli.models.loading import load_model
from tests.helpers.cli import run_main
from tests.helpers.models import build_model
from tests.helpers.result_schema import RESULT_SCHEMA

REPO = "ssacli-test/tiny"
MAIN, V2 = "a" * 40, "b" * 40  # full commit hashes, as the Hub names snapshots
QUICK = ["--probe", "outlier:1", "--samples", "1", "--length", "4", "--random", "--quiet"]
FAST_S = 5.0  # an error without the network comes at once, not after huggingface_hub's retries (~2 min)


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory) -> Path:
    """HF_HOME with a hub cache: REPO at MAIN (refs/main) and at V2 (refs/v2), other weights."""
    home = tmp_path_factory.mktemp("hf-home")
    repo = home / "hub" / f"models--{REPO.replace('/', '--')}"
    for commit, seed in ((MAIN, 0), (V2, 1)):
        build_model("llama", seed=seed).save_pretrained(repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(MAIN)
    (repo / "refs" / "v2").write_text(V2)
    return home


@pytest.fixture
def cache(hf_home, monkeypatch) -> Path:
    """huggingface_hub reads HF_HOME once, at import: in-process tests point its constant at ours."""
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    return hf_home / "hub"


@pytest.fixture
def online(cache, monkeypatch) -> list[str]:
    """The online path: offline mode off, and the Hub's answer to the one request ssacli makes faked
    (main is at V2 now). Returns the URLs asked for."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    asked: list[str] = []

    class Answer:
        commit_hash = V2

    def metadata(url, timeout=None, **_):
        asked.append(url)
        return Answer()

    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", metadata)
    return asked


def no_network(monkeypatch) -> None:
    """What a machine without a network gets from the Hub: a connection error, at once."""

    def metadata(url, timeout=None, **_):
        raise OSError("[Errno -2] Name or service not known")

    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", metadata)


def first_weight(model) -> torch.Tensor:
    return next(model.parameters()).detach()


def test_revisions_split_from_the_id():
    assert split_revision("org/name@v2") == ("org/name", "v2")
    assert split_revision("org/name@refs/pr/1") == ("org/name", "refs/pr/1")
    assert split_revision("org/name") == ("org/name", None)


def test_a_cached_id_loads_by_ref_tag_and_commit_with_its_commit_recorded(cache):
    main = load_model(REPO)
    assert main.weights == {"repo": REPO, "revision": "main", "commit": MAIN}
    assert main.path is None and main.family == "llama"
    tagged = load_model(f"{REPO}@v2")
    assert tagged.weights == {"repo": REPO, "revision": "v2", "commit": V2}
    assert not torch.equal(first_weight(main.model), first_weight(tagged.model))  # the other snapshot
    flagged = load_model(REPO, revision="v2")
    assert flagged.weights["commit"] == V2
    assert torch.equal(first_weight(flagged.model), first_weight(tagged.model))
    pinned = load_model(f"{REPO}@{MAIN}")  # a commit hash: its snapshot, no ref needed
    assert pinned.weights == {"repo": REPO, "revision": MAIN, "commit": MAIN}
    assert torch.equal(first_weight(pinned.model), first_weight(main.model))


def test_diagnose_by_id_records_the_commit_in_its_json(cache, tmp_path, monkeypatch, capsys):
    out = tmp_path / "r.json"
    code, _, stderr = run_main(["diagnose", f"{REPO}@v2", *QUICK, "--json", str(out)], monkeypatch, capsys)
    assert code == 0, stderr
    data = json.loads(out.read_text())
    assert data["model"] == f"{REPO}@v2"
    assert data["weights"] == {"repo": REPO, "revision": "v2", "commit": V2}
    import jsonschema

    jsonschema.validate(data, RESULT_SCHEMA)
    code, _, stderr = run_main(["diagnose", REPO, "--revision", MAIN, *QUICK, "--json", str(out)],
                               monkeypatch, capsys)  # fmt: skip
    assert code == 0, stderr
    assert json.loads(out.read_text())["weights"]["commit"] == MAIN


def test_two_revisions_or_a_revision_of_a_folder_are_refused(cache, tmp_path):
    with pytest.raises(UsageError, match="names revision 'v2' and --revision names 'main'"):
        load_model(f"{REPO}@v2", revision="main")
    with pytest.raises(UsageError, match="--revision applies to Hub ids"):
        load_model("builtin:every-softmax", revision="v2")


def test_offline_a_missing_id_is_one_line_naming_offline_mode(cache, monkeypatch, capsys):
    started = time.perf_counter()
    code, _, stderr = run_main(["diagnose", "ssacli-test/absent", *QUICK], monkeypatch, capsys)
    lines = stderr.strip().splitlines()
    assert code == EXIT_INPUT and len(lines) == 1, stderr
    assert "not in the Hugging Face cache" in lines[0] and "HF_HUB_OFFLINE=1" in lines[0]
    assert time.perf_counter() - started < FAST_S


def test_online_the_commit_comes_from_one_request_and_a_cached_snapshot_loads_from_disk(online):
    loaded = load_model(REPO)  # the cache's refs/main says MAIN; the Hub says main is V2 now
    assert loaded.weights == {"repo": REPO, "revision": "main", "commit": V2}
    assert online == [f"{constants.ENDPOINT}/{REPO}/resolve/main/config.json"]  # one request, no more


def test_offline_flag_never_asks_the_hub(online):
    loaded = load_model(REPO, offline=True)
    assert loaded.weights["commit"] == MAIN and online == []  # the cache's ref, not the Hub's answer
    with pytest.raises(InputError, match=r"offline mode is on \(--offline\)"):
        load_model("ssacli-test/absent", offline=True)
    assert online == []


def test_without_a_network_a_cached_id_loads_and_a_missing_one_is_one_line_at_once(
    online, monkeypatch, capsys
):
    no_network(monkeypatch)
    assert load_model(REPO).weights["commit"] == MAIN  # as transformers does: the cached snapshot
    started = time.perf_counter()
    code, _, stderr = run_main(["diagnose", "ssacli-test/absent", *QUICK], monkeypatch, capsys)
    elapsed = time.perf_counter() - started
    lines = stderr.strip().splitlines()
    assert code == EXIT_INPUT and len(lines) == 1, stderr
    line = lines[0]
    assert "cannot reach the Hugging Face Hub" in line and "Name or service not known" in line
    assert "HF_HUB_OFFLINE=1" in line and "--offline" in line and "Traceback" not in stderr
    assert elapsed < FAST_S, f"{elapsed:.1f} s"


def test_allow_download_is_accepted_and_changes_nothing(cache, monkeypatch, capsys):
    code, _, stderr = run_main(["diagnose", REPO, "--allow-download", *QUICK], monkeypatch, capsys)
    assert code == 0, stderr
    monkeypatch.setenv("COLUMNS", "200")
    code, page, _ = run_main(["diagnose", "--help"], monkeypatch, capsys)
    assert code == 0 and "org/name[@REV]" in page  # not eaten as rich markup
    assert "--offline" in page and "--allow-download" not in page  # accepted for one release, not listed
    code, _, stderr = run_main(["diagnose", f"{REPO}@v2", "--revision", "main", *QUICK], monkeypatch, capsys)
    assert code == EXIT_USAGE and len(stderr.strip().splitlines()) == 1, stderr


def test_the_console_script_reads_hf_home_and_hf_hub_offline(hf_home, tmp_path):
    """As a user runs it: HF_HOME names the cache (no constant patched), HF_HUB_OFFLINE=1 the mode."""
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    out = tmp_path / "r.json"
    cli = [sys.executable, "-c", "from ssacli.cli import main; main()"]  # the console script's call
    done = subprocess.run([*cli, "diagnose", REPO, *QUICK, "--json", str(out)], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["weights"]["commit"] == MAIN
    started = time.perf_counter()
    done = subprocess.run([*cli, "diagnose", "ssacli-test/absent", *QUICK], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == EXIT_INPUT and len(lines) == 1, done.stderr
    assert str(hf_home / "hub") in lines[0] and "HF_HUB_OFFLINE=1" in lines[0]
    assert time.perf_counter() - started < 60  # a fresh interpreter, but no retries


def test_check_warns_when_the_baseline_measured_another_commit(cache, tmp_path, monkeypatch, capsys):
    base, require = tmp_path / "base.json", ["-r", "entropy@outlier:1 >= 0"]
    code, _, stderr = run_main(["diagnose", f"{REPO}@v2", *QUICK, "--json", str(base)], monkeypatch, capsys)
    assert code == 0, stderr
    args = ["check", REPO, *require, "--random", "--baseline", str(base)]
    code, _, stderr = run_main(args, monkeypatch, capsys)
    warned = [line for line in stderr.splitlines() if "other weights" in line]
    assert code == 0 and len(warned) == 1, stderr  # one line, and the gate still passes
    assert f"at commit {V2[:12]}" in warned[0] and f"at commit {MAIN[:12]}" in warned[0]
    code, _, stderr = run_main([*args[:2], "--revision", "v2", *args[2:]], monkeypatch, capsys)
    assert code == 0 and "other weights" not in stderr, stderr


def test_loading_keeps_the_hubs_download_bars_and_quiets_the_per_layer_ones():
    """transformers' switch turns both off; a multi-GB download with no bar would look hung."""
    from huggingface_hub.utils import are_progress_bars_disabled
    from transformers.utils import logging as hf_logging

    from ssacli.models.hub import quiet_progress

    if constants.HF_HUB_DISABLE_PROGRESS_BARS:
        pytest.skip("HF_HUB_DISABLE_PROGRESS_BARS is set: the bars are off here by the user's choice")
    hf_logging.enable_progress_bar()  # both on, as in a fresh process
    with quiet_progress():
        assert not hf_logging.is_progress_bar_enabled()  # no "Loading weights" bar
        assert not are_progress_bars_disabled()  # huggingface_hub's download bars
    assert hf_logging.is_progress_bar_enabled() and not are_progress_bars_disabled()


def test_a_missing_snapshot_is_downloaded_before_the_live_display_then_loaded(
    online, cache, monkeypatch, capsys
):
    """The Hub says main is at a commit the cache lacks: the command downloads it first (check_inputs,
    before any live display holds back huggingface_hub's bars), then loads it from the cache."""
    new = "c" * 40
    fetched = []

    class Answer:
        commit_hash = new

    asked = []

    def metadata(url, timeout=None, **_):
        asked.append(url)
        return Answer()

    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", metadata)

    def download(repo_id, revision=None, allow_patterns=None, **_):
        fetched.append((repo_id, revision, allow_patterns))
        snapshot = cache / f"models--{repo_id.replace('/', '--')}" / "snapshots" / revision
        shutil.copytree(cache / f"models--{repo_id.replace('/', '--')}" / "snapshots" / MAIN, snapshot)
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    out = cache.parent / "r.json"
    code, _, stderr = run_main(["diagnose", REPO, *QUICK, "--json", str(out)], monkeypatch, capsys)
    assert code == 0, stderr
    assert fetched == [(REPO, new, FETCHED)]  # once, at the resolved commit, safetensors not pickles
    assert len(asked) == 1  # one request: the load takes the resolution the download made
    assert json.loads(out.read_text())["weights"]["commit"] == new
    shutil.rmtree(cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / new)

    def broken(*_, **__):
        raise OSError("Connection reset by peer")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", broken)
    code, _, stderr = run_main(["diagnose", REPO, *QUICK], monkeypatch, capsys)
    lines = stderr.strip().splitlines()
    assert code == EXIT_INPUT and len(lines) == 1 and "downloading 'ssacli-test/tiny'" in lines[0], stderr
