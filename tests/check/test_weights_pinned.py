"""Baselines pinned to content (issue 42 item 6): every result records which weights it measured (a
local folder's sha256 over its weight files, ssacli/models/identity.py; a Hub commit in
tests/models/test_hub.py), and `check --baseline` warns in one line when the baseline measured others.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from ssacli.models import identity
from ssacli.models.builtins import BUILTIN_DIR
from tests.helpers.cli import run_main

SOURCE = BUILTIN_DIR / "every-softmax"
REQUIRE = ["-r", "entropy@outlier:1 >= 0"]  # passes: the gate is not what is tested here


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SSACLI_CACHE", str(tmp_path / "ssacli-cache"))


def copy_model(tmp_path: Path, name: str, nudge: bool = False) -> Path:
    """A copy of builtin:every-softmax; ``nudge``: one weight changed by a small amount."""
    folder = tmp_path / name
    shutil.copytree(SOURCE, folder)
    if nudge:
        file = folder / "model.safetensors"
        tensors = load_file(file)
        key = sorted(tensors)[0]
        tensors[key] = tensors[key].clone()
        tensors[key].view(-1)[0] += 1e-3
        save_file(tensors, file, metadata={"format": "pt"})
    return folder


def test_the_hash_is_of_the_weight_files_names_and_bytes(tmp_path):
    same = identity.content_record(copy_model(tmp_path, "a"))
    assert same == identity.content_record(copy_model(tmp_path, "b"))  # where it lies is no part of it
    assert same == {"sha256": same["sha256"], "files": 1}
    data = (SOURCE / "model.safetensors").read_bytes()
    expected = hashlib.sha256(b"model.safetensors\0" + len(data).to_bytes(8, "little") + data).hexdigest()
    assert same["sha256"] == expected
    assert identity.content_record(copy_model(tmp_path, "c", nudge=True))["sha256"] != same["sha256"]
    trained = copy_model(tmp_path, "d")  # optimizer state is not the model's weights
    (trained / "trainer.safetensors").write_bytes(b"optimizer state")
    assert identity.content_record(trained) == same
    assert identity.content_record(tmp_path / "empty-nothing-here") is None


def test_a_digest_is_cached_until_a_file_changes(tmp_path, monkeypatch):
    folder = copy_model(tmp_path, "m")
    first = identity.content_record(folder)
    monkeypatch.setattr(identity, "_digest", lambda files: pytest.fail("hashed again"))
    assert identity.content_record(folder) == first  # no byte read: the cached digest
    monkeypatch.undo()
    monkeypatch.setenv("SSACLI_CACHE", str(tmp_path / "ssacli-cache"))
    copy_model(tmp_path, "n", nudge=True)
    shutil.copy(tmp_path / "n" / "model.safetensors", folder / "model.safetensors")  # rewritten in place
    assert identity.content_record(folder)["sha256"] != first["sha256"]


def test_check_warns_in_one_line_when_the_baseline_measured_other_weights(tmp_path, monkeypatch, capsys):
    model, other = copy_model(tmp_path, "model"), copy_model(tmp_path, "other", nudge=True)
    base = tmp_path / "base.json"
    args = ["diagnose", str(model), "--probe", "outlier:1", "--samples", "1", "--quiet", "--json", str(base)]
    code, _, stderr = run_main(args, monkeypatch, capsys)
    assert code == 0, stderr
    recorded = json.loads(base.read_text())["weights"]
    assert recorded == identity.content_record(model)
    code, _, stderr = run_main(["check", str(model), *REQUIRE, "--baseline", str(base)], monkeypatch, capsys)
    assert code == 0 and "other weights" not in stderr, stderr
    out = tmp_path / "check.json"
    args = ["check", str(other), *REQUIRE, "--baseline", str(base), "--json", str(out)]
    code, _, stderr = run_main(args, monkeypatch, capsys)
    assert code == 0, stderr  # a warning, not a failure
    warned = [line for line in stderr.splitlines() if "other weights" in line]
    assert len(warned) == 1 and warned[0].startswith("warning:"), stderr
    assert recorded["sha256"][:12] in warned[0]
    report = json.loads(out.read_text())
    assert any("other weights" in w for w in report["warnings"])
    assert report["result"]["weights"] == identity.content_record(other)  # the next baseline's


def test_a_converted_folder_records_the_weights_it_came_from(tmp_path):
    import ssacli
    from ssacli.models.checkpoint import read_meta

    out = tmp_path / "converted"
    ssacli.convert("builtin:wikitext-softmax", "ssa", out, samples=1, length=16)
    source = read_meta(out)["source_weights"]
    assert source == identity.content_record(BUILTIN_DIR / "wikitext-softmax")
    assert identity.content_record(out) != source  # the converted folder is other weights


def test_reuse_before_refuses_a_report_of_the_same_name_but_other_weights(tmp_path):
    from ssacli.errors import UsageError
    from ssacli.quality.compare import compare_models

    before, after = str(copy_model(tmp_path, "before")), "builtin:every-ssa"
    common = dict(probes=["outlier:1"], samples=1, prompts=2, icl_length=4, sigmas=[1.0], outliers=[])
    earlier = compare_models(before, after, **common).to_dict()
    assert earlier["before"]["weights"] == identity.content_record(tmp_path / "before")
    shutil.rmtree(tmp_path / "before")
    copy_model(tmp_path, "before", nudge=True)  # the same folder name, retrained
    with pytest.raises(UsageError, match="--reuse-before: the report measured weights with sha256"):
        compare_models(before, after, before_report=earlier, **common)
