"""Bad input never crashes: every case ends in one line on stderr that names the problem and the fix,
the exit code docs/commands.md documents ("Exit codes"), no traceback (unless --debug) and no partial file.

Run them alone with ``pytest -m badinput``. Each case goes through the console-script entry point
(ssacli.cli.main), in-process, or through a real process where a signal is involved.
"""

from __future__ import annotations

import errno
import importlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import SafetensorError

import ssacli
from ssacli.diagnosis.metrics import METRICS
from ssacli.errors import (
    EXIT_CHECK_USAGE,
    EXIT_INPUT,
    EXIT_INTERRUPTED,
    EXIT_UNSUPPORTED,
    EXIT_USAGE,
)
from ssacli.scorers import SCORERS
from ssacli.scorers.base import Scorer
from tests.helpers.cli import run_main
from tests.helpers.faults import full_disk
from tests.helpers.models import build_model

pytestmark = pytest.mark.badinput

QUICK = ["--probe", "outlier:1", "--samples", "1", "--length", "4", "--random", "--quiet"]


# ---- helpers --------------------------------------------------------------------------------------------


def assert_one_line(stderr: str, code: int, expected: int, *words: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == expected, stderr
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error:"), stderr
    assert "Traceback" not in stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def leftovers(folder: Path, name: str) -> list[Path]:
    """Temp files and folders an atomic write of ``name`` would leave in ``folder``."""
    return sorted(folder.glob(f".{name}.*"))


def patch(monkeypatch, target: str, value) -> None:
    """monkeypatch.setattr by 'module.name', resolving the module by import (a submodule
    attribute may also be shadowed by a function of the same name)."""
    module, _, name = target.rpartition(".")
    monkeypatch.setattr(importlib.import_module(module), name, value)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """Tiny checkpoint folders, good and broken, built once."""
    root = tmp_path_factory.mktemp("models")
    good = root / "llama"
    build_model("llama").save_pretrained(good)
    weights = (good / "model.safetensors").read_bytes()
    folders = {"llama": good}

    def folder(name: str, config: dict | None, weights_bytes: bytes | None = weights) -> Path:
        path = root / name
        path.mkdir()
        if config is not None:
            (path / "config.json").write_text(json.dumps(config))
        if weights_bytes is not None:
            (path / "model.safetensors").write_bytes(weights_bytes)
        folders[name] = path
        return path

    config = json.loads((good / "config.json").read_text())
    folder("no-config", None)
    folder("unknown-type", {**config, "model_type": "nope", "architectures": ["NopeForCausalLM"]})
    remote = {
        **config,
        "model_type": "mymodel",
        "architectures": ["MyModelForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_my.MyConfig", "AutoModel": "modeling_my.MyModel"},
    }
    folder("remote", remote)
    folder("truncated", config, weights[: len(weights) // 2])
    folder("garbage", config, b"\x00" * 64)
    zero = root / "zero-layers"
    build_model("llama", num_hidden_layers=0).save_pretrained(zero)
    folders["zero-layers"] = zero
    pickle_only = folder("pickle", config, None)
    torch.save(build_model("llama").state_dict(), pickle_only / "pytorch_model.bin")
    return folders


# ---- 1. MODEL ------------------------------------------------------------------------------------------


MODEL_CASES = [
    ("missing", EXIT_INPUT, ["does not exist"]),
    ("no-config", EXIT_INPUT, ["config.json"]),
    ("unknown-type", EXIT_INPUT, ["'nope'", "upgrade transformers"]),
    ("zero-layers", EXIT_UNSUPPORTED, ["no attention layers"]),
    ("truncated", EXIT_INPUT, ["corrupt or truncated"]),
    ("garbage", EXIT_INPUT, ["corrupt or truncated"]),
    ("pickle", EXIT_INPUT, ["pickle", "--allow-pickle"]),
    ("remote", EXIT_UNSUPPORTED, ["custom code", "--trust-remote-code"]),
    ("someorg/somemodel-not-cached", EXIT_INPUT, ["not in the Hugging Face cache", "HF_HUB_OFFLINE=1"]),
]


@pytest.mark.parametrize("name, expected, words", MODEL_CASES, ids=[c[0] for c in MODEL_CASES])
def test_bad_model_is_one_line(name, expected, words, models, tmp_path, monkeypatch, capsys):
    ref = str(models[name]) if name in models else str(tmp_path / name) if name == "missing" else name
    out = tmp_path / "out.json"
    code, stdout, stderr = run_main(["diagnose", ref, *QUICK, "--json", str(out)], monkeypatch, capsys)
    assert_one_line(stderr, code, expected, *words)
    assert stdout == "" and not out.exists() and not leftovers(tmp_path, "out.json")


def test_a_missing_folder_inside_a_local_folder_is_a_path_not_a_hub_question(tmp_path, monkeypatch, capsys):
    """`models/nope` beside a `models/` folder is a local path that does not exist: said so, without
    sending the user to the Hub (a Hub id such as `org/nope` still gets the Hub advice: offline here,
    tests/conftest.py)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    code, _, stderr = run_main(["diagnose", "models/nope", *QUICK], monkeypatch, capsys)
    line = assert_one_line(stderr, code, EXIT_INPUT, "does not exist")
    assert "Hugging Face" not in line and "offline" not in line
    code, _, stderr = run_main(["diagnose", "org/nope", *QUICK], monkeypatch, capsys)
    assert_one_line(stderr, code, EXIT_INPUT, "Hugging Face cache", "offline mode")


@pytest.mark.parametrize("name", ["zero-layers", "truncated", "remote"])
def test_convert_refuses_bad_models_before_writing(name, models, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    args = ["convert", str(models[name]), "--scorer", "ssa", "--out", str(out)]
    code, _, stderr = run_main(args, monkeypatch, capsys)
    expected = EXIT_INPUT if name == "truncated" else EXIT_UNSUPPORTED
    assert_one_line(stderr, code, expected)
    assert not out.exists() and not leftovers(tmp_path, "out")


def test_debug_shows_the_traceback_too_and_keeps_the_exit_code(tmp_path, monkeypatch, capsys):
    code, _, stderr = run_main(["--debug", "diagnose", str(tmp_path / "nowhere")], monkeypatch, capsys)
    assert code == EXIT_INPUT and "Traceback" in stderr and "InputError: model path" in stderr


def test_allow_pickle_loads_the_checkpoint_with_weights_only(models, monkeypatch, capsys):
    calls = []
    real_load = torch.load

    def spy(*args, **kwargs):
        calls.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    args = ["diagnose", str(models["pickle"]), *QUICK, "--allow-pickle"]
    code, _, stderr = run_main(args, monkeypatch, capsys)
    assert code == 0, stderr
    assert calls and all(value is True for value in calls)


@pytest.mark.parametrize(
    "command, expected",
    [
        (["diagnose", "{model}", *QUICK], EXIT_INPUT),
        (["convert", "{model}", "--scorer", "ssa", "--out", "{out}"], EXIT_INPUT),
        (["report", "{model}", "{model}", "--quiet"], EXIT_INPUT),
        (["check", "{model}", "-r", "entropy@embed-scale:32 >= 0.5"], EXIT_CHECK_USAGE),
        (["check", "--init", "{model}", "--config", "{out}.toml"], EXIT_CHECK_USAGE),
        (["finetune", "{model}", "--data", "{out}.txt", "--out", "{out}"], EXIT_INPUT),  # text: a causal LM's
    ],
    ids=["diagnose", "convert", "report", "check", "check --init", "finetune"],
)
def test_trust_remote_code_is_passed_through_to_transformers(
    command, expected, models, tmp_path, monkeypatch, capsys
):
    """Only that the flag reaches transformers, in every command that loads a MODEL: the stub stops
    before any code could run."""
    import transformers

    seen = []

    def stub(source, **kwargs):
        seen.append(kwargs.get("trust_remote_code"))
        raise OSError("stub: stop before loading anything")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", stub)
    args = [a.format(model=models["remote"], out=tmp_path / "out") for a in command]
    code, _, stderr = run_main([*args, "--trust-remote-code"], monkeypatch, capsys)
    assert_one_line(stderr, code, expected, "stub")
    assert seen and all(value is True for value in seen)
    assert not (tmp_path / "out").exists()
    assert list(tmp_path.iterdir()) == []


# ---- 2. options and files -------------------------------------------------------------------------------


def option_cases(tmp_path: Path) -> list[tuple[list[str], int, str]]:
    (tmp_path / "empty.txt").write_text(" \n\n")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 cr\xe8me br\xfbl\xe9e".encode("latin-1"))
    return [
        (["--text", str(tmp_path / "missing.txt")], EXIT_INPUT, "does not exist"),
        (["--text", str(tmp_path / "empty.txt")], EXIT_INPUT, "empty"),
        (["--text", str(tmp_path / "latin1.txt")], EXIT_INPUT, "not UTF-8"),
        (["--probe", "outlier:0"], EXIT_USAGE, "> 0"),
        (["--probe", "outlier:-3"], EXIT_USAGE, "> 0"),
        (["--probe", "embed-scale:nan"], EXIT_USAGE, "finite"),
        (["--probe", "logit-scale:1e999"], EXIT_USAGE, "finite"),
        (["--probe", "outlier:ten"], EXIT_USAGE, "not a number"),
        (["--probe", "dominant-key:-1"], EXIT_USAGE, "≥ 0"),
        (["--probe", "loudness:2"], EXIT_USAGE, "unknown probe"),
        (["--heatmap", "loudness"], EXIT_USAGE, "unknown metric"),
        (["--scorer", "nope"], EXIT_USAGE, "unknown scorer"),
        (["--scorer", "ssa:init"], EXIT_USAGE, "key=value"),
        (["--scorer", "ssa:n=abc"], EXIT_USAGE, "not a valid float"),
        (["--scorer", "ssa:bogus=1"], EXIT_USAGE, "valid keys"),
        (["--scorer", ""], EXIT_USAGE, "empty scorer spec"),
    ]


def test_bad_options_and_files_are_one_line(tmp_path, monkeypatch, capsys):
    # a language model: it takes --text (an ICL model refuses one whatever the file)
    base = ["diagnose", "builtin:wikitext-softmax", "--samples", "1", "--length", "4", "--quiet"]
    for extra, expected, words in option_cases(tmp_path):
        out = tmp_path / "out.json"
        code, stdout, stderr = run_main([*base, *extra, "--json", str(out)], monkeypatch, capsys)
        assert_one_line(stderr, code, expected, words)
        assert stdout == "" and not out.exists() and not leftovers(tmp_path, "out.json"), extra


def test_convert_refuses_a_bad_scorer_before_loading(tmp_path, monkeypatch, capsys):
    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded before the spec was checked")

    patch(monkeypatch, "ssacli.conversion.run.as_loaded", no_loading)
    for spec, words in (("nope", "unknown scorer"), ("ssa:init", "key=value")):
        args = ["convert", "builtin:every-softmax", "--scorer", spec, "--out", str(tmp_path / "out")]
        code, _, stderr = run_main(args, monkeypatch, capsys)
        assert_one_line(stderr, code, EXIT_USAGE, words)
    assert not (tmp_path / "out").exists()


# ---- 3. where outputs go -------------------------------------------------------------------------------


def test_out_equal_to_the_input_folder_is_refused_and_the_input_is_untouched(
    models, tmp_path, monkeypatch, capsys
):
    source = tmp_path / "model"
    shutil.copytree(models["llama"], source)
    before = snapshot(source)
    for extra in ([], ["--overwrite"]):
        args = ["convert", str(source), "--scorer", "ssa", "--out", str(source), *extra]
        code, _, stderr = run_main(args, monkeypatch, capsys)
        assert_one_line(stderr, code, EXIT_USAGE, "input model's folder", "another --out")
        assert snapshot(source) == before and not leftovers(tmp_path, "model")


def _read_only(folder: Path, monkeypatch) -> None:
    """Make ``folder`` unwritable: by permissions, or (as root, who ignores them) by making every
    temp file or folder created in it fail as a read-only folder would."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return
    for name in ("mkdtemp", "mkstemp"):
        real = getattr(tempfile, name)

        def refuse(*args, _real=real, **kwargs):
            if Path(kwargs.get("dir") or ".").resolve() == folder.resolve():
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(folder))
            return _real(*args, **kwargs)

        monkeypatch.setattr(tempfile, name, refuse)


@pytest.mark.parametrize("model", ["builtin:every-softmax", "llama"])
def test_out_in_a_read_only_folder_is_one_line(model, models, tmp_path, monkeypatch, capsys):
    parent = tmp_path / "ro"
    parent.mkdir()
    _read_only(parent, monkeypatch)
    try:
        ref = str(models.get(model, model))
        args = ["convert", ref, "--scorer", "ssa", "--out", str(parent / "out")]
        code, _, stderr = run_main(args, monkeypatch, capsys)
        assert_one_line(stderr, code, EXIT_INPUT, "cannot write", str(parent / "out"))
        assert list(parent.iterdir()) == []
    finally:
        parent.chmod(0o755)


def test_json_in_a_read_only_folder_is_one_line(tmp_path, monkeypatch, capsys):
    parent = tmp_path / "ro"
    parent.mkdir()
    _read_only(parent, monkeypatch)
    try:
        out = parent / "r.json"
        code, _, stderr = run_main(
            ["diagnose", "builtin:every-softmax", *QUICK, "--json", str(out)], monkeypatch, capsys
        )
        assert_one_line(stderr, code, EXIT_INPUT, "cannot write", "r.json")
        assert list(parent.iterdir()) == []
    finally:
        parent.chmod(0o755)


def _disk_full(kind: str):
    def fail(*args, **kwargs):
        if kind == "oserror":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        # what safetensors raises when the disk fills up under it
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    return fail


@pytest.mark.parametrize("kind", ["oserror", "safetensors"])
@pytest.mark.parametrize("model", ["builtin:every-softmax", "llama"])
def test_disk_full_leaves_the_old_out_untouched(kind, model, models, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("the previous content")
    (out / "ssacli.json").write_text('{"format": "ssacli-model", "format_version": 1}')  # ssacli's
    before = snapshot(out)
    # ICL and transformers checkpoints are both written by ssacli.models.checkpoint
    patch(monkeypatch, "ssacli.models.checkpoint.save_file", _disk_full(kind))
    ref = str(models.get(model, model))
    args = ["convert", ref, "--scorer", "ssa", "--out", str(out), "--overwrite"]
    code, _, stderr = run_main(args, monkeypatch, capsys)
    assert_one_line(stderr, code, EXIT_INPUT, "cannot write", "No space left on device", "free some space")
    assert snapshot(out) == before
    assert leftovers(tmp_path, "out") == []


@pytest.mark.parametrize("kind", ["oserror", "safetensors"])
def test_disk_full_during_icl_train_leaves_the_old_checkpoint(kind, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "old.txt").write_text("the previous run")
    (out / "ssacli.json").write_text('{"format": "ssacli-icl", "format_version": 1}')  # ssacli's
    before = snapshot(out)
    patch(monkeypatch, "ssacli.models.checkpoint.save_file", _disk_full(kind))
    args = ["icl", "train", "--task", "every", "--steps", "2", "--checkpoint-every", "1", "--out", str(out)]
    code, _, stderr = run_main([*args, "--overwrite", "--device", "cpu"], monkeypatch, capsys)
    # icl train draws its progress bar on stderr too; the error is the one line after it
    progress, _, error = stderr.rstrip("\n").rpartition("\n")
    assert "Traceback" not in progress
    assert_one_line(error + "\n", code, EXIT_INPUT, "cannot write", "No space left on device")
    assert snapshot(out) == before
    assert leftovers(tmp_path, "run") == []


OLD_RESULT = '{"schema": "ssacli-diagnose"}\n'


def test_disk_full_while_writing_json_leaves_no_file(tmp_path, monkeypatch, capsys):
    out = tmp_path / "r.json"
    out.write_text(OLD_RESULT)  # an earlier result of ssacli's, which it may replace
    full_disk(monkeypatch, name_starts=".r.json.")
    code, _, stderr = run_main(
        ["diagnose", "builtin:every-softmax", *QUICK, "--json", str(out)], monkeypatch, capsys
    )
    assert_one_line(stderr, code, EXIT_INPUT, "cannot write", "No space left on device")
    assert out.read_text() == OLD_RESULT and not leftovers(tmp_path, "r.json")


# ---- 4. device ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["diagnose", "convert"])
def test_cuda_without_cuda_is_a_usage_error(command, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    if command == "diagnose":
        args = ["diagnose", "builtin:every-softmax", *QUICK]
    else:
        args = ["convert", "builtin:every-softmax", "--scorer", "ssa", "--out", str(tmp_path / "out")]
    code, _, stderr = run_main([*args, "--device", "cuda"], monkeypatch, capsys)
    assert_one_line(stderr, code, EXIT_USAGE, "no CUDA device", "--device cpu")
    assert not (tmp_path / "out").exists()


# ---- 5. interruptions ------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["ssacli.models.checkpoint.save_file", "ssacli.files.publish"])
@pytest.mark.parametrize("existing", [False, True])
def test_ctrl_c_while_convert_writes_leaves_nothing_half_written(
    where, existing, models, tmp_path, monkeypatch, capsys
):
    """KeyboardInterrupt in the middle of the write (save_file: the temp folder is half-filled;
    publish: the old folder has already been moved aside)."""
    out = tmp_path / "out"
    if existing:
        out.mkdir()
        (out / "old.txt").write_text("the previous content")
        (out / "ssacli.json").write_text('{"format": "ssacli-model", "format_version": 1}')  # ssacli's
    before = snapshot(out) if existing else None

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    patch(monkeypatch, where, interrupt)
    args = ["convert", str(models["llama"]), "--scorer", "ssa", "--out", str(out), "--overwrite"]
    code, _, stderr = run_main(args, monkeypatch, capsys)
    assert_one_line(stderr, code, EXIT_INTERRUPTED, "interrupted")
    if existing:
        assert snapshot(out) == before
    else:
        assert not out.exists()
    assert leftovers(tmp_path, "out") == []


def test_sigterm_while_convert_writes_ends_like_ctrl_c(models, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"

    def terminate(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)  # the handler raises before this ends

    previous = signal.getsignal(signal.SIGTERM)
    patch(monkeypatch, "ssacli.models.checkpoint.save_file", terminate)
    args = ["convert", str(models["llama"]), "--scorer", "ssa", "--out", str(out)]
    code, _, stderr = run_main(args, monkeypatch, capsys)
    assert_one_line(stderr, code, EXIT_INTERRUPTED, "interrupted")
    assert not out.exists() and leftovers(tmp_path, "out") == []
    assert signal.getsignal(signal.SIGTERM) is previous


def test_sigint_during_finetune_checkpoints_and_resumes(tmp_path):
    """A real Ctrl-C to a real process: exit 130, one line, and `finetune --resume` continues.
    (tests/train/test_finetune.py checks that the resumed run equals an uninterrupted one.)"""
    from ssacli.models.checkpoint import training_record

    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "ssacli", "convert", "builtin:every-softmax", "--scorer", "ssa"]
    cmd += ["--finetune", "--data", "icl:every", "--steps", "100000", "--checkpoint-every", "5"]
    cmd += ["--batch-size", "4", "--quiet", "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not out.exists():  # the step-0 checkpoint: the signal handler is installed
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == EXIT_INTERRUPTED, stderr
    line = assert_one_line(stderr, EXIT_INTERRUPTED, EXIT_INTERRUPTED, "interrupted at step")
    assert "--resume" in line
    step = training_record(out)["step"]
    assert 1 <= step < 100000 and not leftovers(tmp_path, "run")
    resumed = subprocess.run(
        [sys.executable, "-m", "ssacli", "finetune", str(out), "--resume", "--steps", str(step + 2), "-q"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert training_record(out)["step"] == step + 2


# ---- 6. numbers ------------------------------------------------------------------------------------------

PROBE_FAMILIES = ["embed-scale", "outlier", "logit-scale", "dominant-key"]
# tests/diagnosis/test_metrics.py checks them
UNIT_METRICS = [name for name, spec in METRICS.items() if spec.bounded]


@pytest.fixture(scope="module")
def tiny_models() -> dict[torch.dtype, torch.nn.Module]:
    return {dtype: build_model("llama").to(dtype) for dtype in (torch.float32, torch.bfloat16)}


def check_finite(model, scorer: str, probe: str, level: float, length: int) -> None:
    """Weights finite at every call; each metric either finite and in range, or undefined (NaN)
    for a head that had no row to count, and then all its metrics are."""
    bad = []
    real_forward = Scorer.forward

    def forward(self, scores, *args, **kwargs):
        weights = real_forward(self, scores, *args, **kwargs)
        if not torch.isfinite(weights).all():
            bad.append(self.spec)
        return weights

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Scorer, "forward", forward)
        result = ssacli.diagnose(
            model, [f"{probe}:{level}"], scorer=scorer, samples=2, length=length, random_ids=True
        )
    where = (scorer, probe, level, length, next(model.parameters()).dtype)
    assert not bad, ("non-finite weights", *where)
    metrics = result.probes[0].metrics
    row_metrics = [name for name in metrics if name not in ("outlier_capture", "learned_sink")]
    undefined = np.isnan(metrics["entropy"])
    if "learned_sink" in metrics:  # this model has no learned sink: the metric is undefined (NaN) throughout
        assert np.isnan(np.asarray(metrics["learned_sink"], dtype=float)).all(), where
    for name, values in metrics.items():
        values = np.asarray(values, dtype=float)
        assert not np.isinf(values).any(), (name, *where)
        if name in row_metrics:  # undefined only together: a head with no counted row
            assert (np.isnan(values) == undefined).all(), (name, *where)
        defined = values[~np.isnan(values)]
        if name in UNIT_METRICS:
            assert ((defined >= -1e-6) & (defined <= 1 + 1e-6)).all(), (name, *where)
        elif name == "effective_tokens":
            assert ((defined >= 1 - 1e-4) & (defined <= length + 1e-3)).all(), (name, *where)
        else:  # row_mass
            assert (defined >= 0).all(), (name, *where)
    assert not undefined.all(), ("no head measured at all", *where)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_every_scorer_and_probe_family_stays_finite_at_the_extremes(dtype, tiny_models):
    for scorer in SCORERS:
        for probe in PROBE_FAMILIES:
            for level in (1.0, 1e4):
                check_finite(tiny_models[dtype], scorer, probe, level, length=9)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    scorer=st.sampled_from(sorted(SCORERS)),
    probe=st.sampled_from(PROBE_FAMILIES),
    exponent=st.floats(0.0, 4.0),
    length=st.integers(2, 40),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_fuzz_scorer_probe_level_length_dtype(tiny_models, scorer, probe, exponent, length, dtype):
    level = float(f"{10**exponent:.6g}")  # what a user can type
    assert math.isfinite(level) and 1 <= level <= 1e4
    check_finite(tiny_models[dtype], scorer, probe, level, length)
