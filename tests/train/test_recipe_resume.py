"""The conversion recipe keeps its work: a crash or a signal mid-stage leaves a checkpoint in OUT
(a loadable model and its state), ``resume=True`` finishes with the weights of an uninterrupted run,
and one job at a time writes an output folder (the lock beside it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from contextlib import contextmanager

import pytest
import torch
from typer.testing import CliRunner

from ssacli.cli import app
from ssacli.errors import InterruptedJobError, UsageError
from ssacli.files import lock_path, writer_lock
from ssacli.models.loading import load_model
from ssacli.train.recipe import RecipeConfig, convert_with_recipe, softmax_control
from tests.helpers.cli import run_main

MODEL = "builtin:wikitext-softmax"
# every 4 steps a checkpoint; evaluations every 6: a crash between the two must replay both alike
SETTINGS = dict(
    transfer_steps=12, distill_steps=12, eval_every=6, batch_size=4, seq_len=32, checkpoint_every=4
)


def config(text, **changes) -> RecipeConfig:
    return RecipeConfig(data=text, **{**SETTINGS, **changes})


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def recorded(out) -> dict:
    return json.loads((out / "ssacli.json").read_text())["recipe"]


def stop_at(stage: str, step: int, action):
    def on_step(at_stage, done, *_):
        if (at_stage, done) == (stage, step):
            action()

    return on_step


@pytest.fixture(scope="module")
def reference(text, tmp_path_factory):
    """The uninterrupted run (checkpoints included: writing one must not change the run)."""
    out = tmp_path_factory.mktemp("ref") / "out"
    trained, record = convert_with_recipe(MODEL, out, config(text), device="cpu")
    return weights(trained.model), record


def assert_same_run(model, record, reference) -> None:
    """Exactly (tolerance 0): the same weights, evaluations and loss history bit for bit."""
    expected, expected_record = reference
    state = weights(model)
    assert state.keys() == expected.keys()
    for key in state:
        assert torch.equal(state[key], expected[key]), key
    for key in ("evaluations", "history", "final", "config"):
        assert record[key] == expected_record[key], key
    assert record["finished"] is True and "at" not in record


def test_a_crash_mid_distillation_leaves_a_checkpoint_and_resuming_ends_as_the_uninterrupted_run(
    text, tmp_path, reference
):
    out = tmp_path / "out"

    def power_cut():
        raise RuntimeError("power cut")

    with pytest.raises(RuntimeError, match="power cut"):
        convert_with_recipe(MODEL, out, config(text), device="cpu", on_step=stop_at("distill", 10, power_cut))
    saved = recorded(out)
    assert saved["finished"] is False and saved["at"] == {"stage": "distill", "step": 8}
    assert (out / "stages" / "transfer" / "ssacli.json").is_file()  # the finished stage is kept
    assert (out / "trainer.safetensors").is_file()
    assert not lock_path(out).exists()  # the lock goes with the job, even a crashed one
    partial = load_model(str(out), dtype="float32")  # the checkpoint is a model like any other
    assert not any("lora" in k for k in partial.model.state_dict())
    with pytest.raises(UsageError, match="already exists"):  # a restart must say --resume
        convert_with_recipe(MODEL, out, config(text), device="cpu")
    trained, record = convert_with_recipe(MODEL, out, config(text), resume=True, device="cpu")
    assert_same_run(trained.model, record, reference)
    assert recorded(out)["evaluations"] == record["evaluations"]
    assert not (out / "trainer.safetensors").exists()  # a finished run keeps no resume state
    assert (out / "stages" / "transfer" / "ssacli.json").is_file()


def test_a_crashed_softmax_control_resumes_to_the_uninterrupted_control(text, tmp_path):
    """The control has no scorer tensors to restore, only its adapters and optimizer."""
    settings = config(text, distill_steps=8, transfer_steps=None)
    _, expected_record = softmax_control(MODEL, tmp_path / "ref", settings, device="cpu")
    expected = weights(load_model(str(tmp_path / "ref"), dtype="float32").model)

    def power_cut():
        raise RuntimeError("power cut")

    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="power cut"):
        softmax_control(MODEL, out, settings, device="cpu", on_step=stop_at("distill", 6, power_cut))
    assert recorded(out)["at"] == {"stage": "distill", "step": 4}
    _, record = softmax_control(MODEL, out, settings, resume=True, device="cpu")
    state = weights(load_model(str(out), dtype="float32").model)
    assert state.keys() == expected.keys()
    assert all(torch.equal(state[k], expected[k]) for k in state)
    assert record["history"] == expected_record["history"] and record["control"] is True


@pytest.mark.parametrize(
    ("sig", "stage", "step"), [(signal.SIGINT, "distill", 7), (signal.SIGTERM, "transfer", 5)]
)
def test_a_signal_mid_stage_checkpoints_its_step_and_resuming_finishes_the_same(
    text, tmp_path, reference, sig, stage, step
):
    out = tmp_path / "out"
    previous = signal.getsignal(sig)
    interrupt = stop_at(stage, step, lambda: os.kill(os.getpid(), sig))
    with pytest.raises(InterruptedJobError, match=f"interrupted at step {step}") as err:
        convert_with_recipe(MODEL, out, config(text), device="cpu", on_step=interrupt)
    assert err.value.exit_code == 130 and "--resume" in str(err.value)
    assert signal.getsignal(sig) is previous
    assert recorded(out)["at"] == {"stage": stage, "step": step}  # the step itself, not the last periodic one
    assert (out / "stages").exists() == (stage == "distill")  # transfer's snapshot once it finished
    trained, record = convert_with_recipe(MODEL, out, config(text), resume=True, device="cpu")
    assert_same_run(trained.model, record, reference)


def test_resuming_refuses_other_settings_and_a_finished_run(text, tmp_path):
    out = tmp_path / "out"
    small = dict(transfer_steps=2, distill_steps=2, checkpoint_every=1)
    interrupt = stop_at("transfer", 1, lambda: os.kill(os.getpid(), signal.SIGINT))
    with pytest.raises(InterruptedJobError):
        convert_with_recipe(MODEL, out, config(text, **small), device="cpu", on_step=interrupt)
    with pytest.raises(UsageError, match=r"other settings \(lr 0.0005 -> 0.001\)"):
        convert_with_recipe(MODEL, out, config(text, **small, lr=1e-3), resume=True, device="cpu")
    before = recorded(out)
    _, record = convert_with_recipe(
        MODEL, out, config(text, **{**small, "checkpoint_every": 7}), resume=True, device="cpu"
    )
    assert record["finished"] and before["at"] == {"stage": "transfer", "step": 1}
    with pytest.raises(UsageError, match="finished conversion; nothing to resume"):
        convert_with_recipe(MODEL, out, config(text, **small), resume=True, device="cpu")


@contextmanager
def lock_held_elsewhere(out):
    """Another process holding ``out``'s lock (it yields that process); SIGKILLed at the end, so its
    lock file stays behind as a dead writer's would."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom ssacli.files import writer_lock\n"
         "with writer_lock(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(120)\n", str(out)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.kill()
        holder.wait()


def test_a_second_writer_of_the_same_out_is_refused_at_once(text, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    with lock_held_elsewhere(out) as holder:
        with pytest.raises(
            UsageError, match=rf"being written by another ssacli job \(process {holder.pid} on"
        ):
            convert_with_recipe(MODEL, out, config(text), device="cpu")
        assert not out.exists()  # refused before any work
        args = ["convert", MODEL, "--scorer", "ssa:init=faithful", "--out", str(out)]
        code, _, err = run_main(args, monkeypatch, capsys)
        assert code == 2 and "being written by another ssacli job" in err
        assert len(err.strip().splitlines()) == 1
    assert lock_path(out).exists()  # SIGKILL left it; the writer is gone, so the next job takes it over
    with writer_lock(out):
        with writer_lock(out):  # the same process may nest (convert, then finetune, into one folder)
            pass
        assert lock_path(out).exists()
    assert not lock_path(out).exists()


def test_the_cli_resumes_a_recipe_with_the_same_options(text, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    small = dict(transfer_steps=3, distill_steps=3, batch_size=2, seq_len=16, checkpoint_every=2)
    api = RecipeConfig(data=text, **small)
    with pytest.raises(ZeroDivisionError):  # any exception: the last checkpoint stays
        convert_with_recipe(MODEL, out, api, device="cpu", on_step=stop_at("distill", 1, lambda: 1 / 0))
    args = ["convert", MODEL, "--scorer", "ssa", "--finetune", "--data", text, "--out", str(out),
            "--transfer-steps", "3", "--distill-steps", "3", "--batch-size", "2", "--seq-len", "16",
            "--checkpoint-every", "2", "--device", "cpu", "--quiet"]  # fmt: skip
    code, _, err = run_main(args, monkeypatch, capsys)
    assert code == 2 and "already exists" in err
    result = CliRunner().invoke(app, [*args, "--resume"])
    assert result.exit_code == 0, result.output
    assert recorded(out)["finished"] is True
    args = ["convert", MODEL, "--scorer", "ssa:init=faithful", "--out", str(tmp_path / "x"), "--resume"]
    code, _, err = run_main(args, monkeypatch, capsys)
    assert code == 2 and "--resume only applies with --finetune" in err


@pytest.mark.parametrize(("heartbeat", "lines"), [(0.0, 3), (1e9, 0)])
def test_quiet_runs_still_say_they_are_alive_every_heartbeat(heartbeat, lines, monkeypatch, capsys):
    """--quiet drops the bar and the step log, not the heartbeat: a line at least every HEARTBEAT_S
    (here 0 s: every step; or never within the test)."""
    from ssacli.cli import training

    monkeypatch.setattr(training, "HEARTBEAT_S", heartbeat)
    with training.training_display(3, log_every=100, quiet=True, description="distill") as on_step:
        for step in (1, 2, 3):
            on_step(step, 0.5, 1e-4, 1000.0)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == lines and all(line.startswith("distill step ") and "left" in line for line in err)


def test_only_rank_0_of_a_launch_holds_the_lock(tmp_path, monkeypatch):
    """torchrun and accelerate launch start every rank with the same --out: the other ranks never
    write, so they neither take the lock nor are refused by rank 0's (held here by another process)."""
    out = tmp_path / "out"
    with lock_held_elsewhere(out):
        monkeypatch.setenv("RANK", "1")
        with writer_lock(out):  # rank 1 goes on
            pass
        monkeypatch.setenv("RANK", "0")
        with pytest.raises(UsageError, match="being written by another ssacli job"):
            with writer_lock(out):  # a second job's rank 0 is refused
                pass
