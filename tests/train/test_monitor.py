"""Saturation monitoring during training (ssacli.SaturationCallback, ssacli.train.monitor).

The reference for every logged value is an independent ``ssacli.diagnose`` of the checkpoint the
Trainer saved at that step, on the inputs diagnose builds itself from the saved tokenizer (same
samples, length and seed), reduced to layer and model means here with numpy. The model is a tiny
Llama built from its config with the bundled LM's BPE tokenizer; nothing is downloaded.
"""

from __future__ import annotations

import json
import socket
import warnings

import numpy as np
import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

import ssacli
from ssacli.diagnosis.texts import TEXTS
from ssacli.errors import UsageError
from ssacli.train.monitor import SaturationMonitor
from tests.helpers.monitor_worker import (
    two_rank_worker,  # its own module: the children need not import Trainer
)

PROBE = "key-scale"
LEVELS = (1.0, 8.0)
METRICS = ("entropy", "max_weight", "collapse_rate", "sink_rate")
LAYERS = 2
SAMPLES, LENGTH = 4, 32


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tokenizer():
    return ssacli.load_model("builtin:wikitext-softmax", device="cpu").tokenizer


def tiny_llama(tokenizer, seed: int = 0) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def train_data(tokenizer, length: int = 32) -> list[dict[str, torch.Tensor]]:
    ids = tokenizer("\n\n".join(TEXTS), verbose=False)["input_ids"]
    windows = [torch.tensor(ids[i : i + length]) for i in range(0, len(ids) - length, length)]
    return [{"input_ids": w, "labels": w} for w in windows]


class Reporter(TrainerCallback):
    """What a reporter (TensorBoard, W&B) is handed: every on_log's values, in order. Listed before
    the monitor, as the Trainer lists its reporters before the user's callbacks."""

    def __init__(self) -> None:
        self.logs: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append({**(logs or {}), "step": state.global_step})


def run_trainer(tokenizer, out, *, callback: str | None, steps: int = 20, every: int = 10, **args):
    """A tiny Llama's Trainer run; ``callback``: "callbacks" (the monitor in Trainer(callbacks=[…])
    after a Reporter, built without the trainer), "trainer" (the older form: built with the trainer,
    added by add_callback) or None."""
    model = tiny_llama(tokenizer)
    arguments = TrainingArguments(
        str(out), max_steps=steps, per_device_train_batch_size=4, learning_rate=1e-2, save_steps=every,
        logging_steps=5, report_to=[], use_cpu=True, disable_tqdm=True, seed=0, **args,
    )  # fmt: skip
    options = dict(every=every, probes=[f"{PROBE}:1,8"], samples=SAMPLES, length=LENGTH)
    reporter = Reporter()
    callbacks = [reporter, ssacli.SaturationCallback(**options)] if callback == "callbacks" else None
    trainer = Trainer(
        model=model, args=arguments, train_dataset=train_data(tokenizer), processing_class=tokenizer,
        callbacks=callbacks,
    )  # fmt: skip
    if callback == "trainer":
        trainer.add_callback(ssacli.SaturationCallback(trainer, **options))
    trainer.reporter = reporter
    trainer.train()
    return trainer


def monitored(entries) -> dict[int, dict]:
    """The monitor's entries by step (an entry with ssacli/monitor_seconds is one measurement)."""
    return {h["step"]: h for h in entries if "ssacli/monitor_seconds" in h}


def expected_keys(layers: int) -> set[str]:
    keys = {"ssacli/monitor_seconds"}
    for level in ("1", "8"):
        keys.add(f"ssacli/overflow@{PROBE}:{level}")
        for metric in METRICS:
            keys.add(f"ssacli/model/{metric}@{PROBE}:{level}")
            keys |= {f"ssacli/layer{i}/{metric}@{PROBE}:{level}" for i in range(layers)}
    return keys


def reference(folder) -> dict[str, float]:
    """A diagnose of the saved checkpoint on the batch diagnose builds itself, reduced here."""
    result = ssacli.diagnose(str(folder), [f"{PROBE}:1,8"], samples=SAMPLES, length=LENGTH, device="cpu")
    probe = result.probe(PROBE)
    assert probe.levels == list(LEVELS)
    values = {}
    for li, level in enumerate(("1", "8")):
        for metric in METRICS:
            heads = probe.metrics[metric][li]  # [layer, head]
            for layer in range(heads.shape[0]):
                values[f"ssacli/layer{layer}/{metric}@{PROBE}:{level}"] = float(np.nanmean(heads[layer]))
            values[f"ssacli/model/{metric}@{PROBE}:{level}"] = float(np.nanmean(heads))
    return values


def test_twenty_trainer_steps_log_what_diagnose_measures_on_each_checkpoint(tokenizer, tmp_path):
    start = tmp_path / "start"
    tiny_llama(tokenizer).save_pretrained(start)  # the model as step 0 measures it
    tokenizer.save_pretrained(start)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the fallback's warning (no Trainer found) would fail here
        trainer = run_trainer(tokenizer, tmp_path / "run", callback="callbacks")
    logged = monitored(trainer.state.log_history)
    assert sorted(logged) == [0, 10, 20]
    # a reporter listed before the monitor got every value, with the Trainer's step
    assert monitored(trainer.reporter.logs) == {step: logged[step] for step in (0, 10, 20)}
    folders = {0: start, 10: tmp_path / "run" / "checkpoint-10", 20: tmp_path / "run" / "checkpoint-20"}
    for step, folder in folders.items():
        entry = logged[step]
        assert {k for k in entry if k.startswith("ssacli/")} == expected_keys(LAYERS)
        assert all(isinstance(entry[k], float) for k in expected_keys(LAYERS))
        assert entry[f"ssacli/overflow@{PROBE}:8"] == 0.0 and entry["ssacli/monitor_seconds"] > 0
        for key, value in reference(folder).items():
            assert entry[key] == pytest.approx(value, rel=1e-6, abs=1e-6), (step, key)
    # The comparison can fail: training moved what is compared (the 20 steps sharpen layer 1's
    # attention under the key shift; level 1 at step 0 is near-uniform, entropy ≈ 1).
    moved = f"ssacli/layer1/max_weight@{PROBE}:8"
    assert logged[20][moved] > logged[0][moved] * 1.2
    # The JSON reporter's record holds the same numbers (trainer_state.json's log_history).
    saved = json.loads((folders[20] / "trainer_state.json").read_text())["log_history"]
    assert [h for h in saved if "ssacli/monitor_seconds" in h][-1] == logged[20]


def test_the_callback_changes_nothing_in_training_and_the_trainer_form_logs_the_same(tokenizer, tmp_path):
    run = dict(steps=6, every=2, save_strategy="no")
    with_monitor = run_trainer(tokenizer, tmp_path / "a", callback="callbacks", **run)
    without = run_trainer(tokenizer, tmp_path / "b", callback=None, **run)
    older = run_trainer(tokenizer, tmp_path / "c", callback="trainer", **run)

    def values(trainer) -> dict:
        return {s: {k: v for k, v in h.items() if k != "ssacli/monitor_seconds"}
                for s, h in monitored(trainer.state.log_history).items()}  # fmt: skip

    assert sorted(values(with_monitor)) == [0, 2, 4, 6] and values(older) == values(with_monitor)
    a, b = with_monitor.model.state_dict(), without.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert with_monitor.model.training == without.model.training
    assert with_monitor.model.config._attn_implementation == without.model.config._attn_implementation


def test_own_loop_log_measures_at_due_steps_and_keeps_json_history(tokenizer):
    model = tiny_llama(tokenizer)
    monitor = SaturationMonitor(every=3, probes=["key-scale:1,8"], samples=2, length=16, at_start=False)
    returned = {s: monitor.log(s, model, tokenizer) for s in range(8)}
    assert [s for s, v in returned.items() if v is not None] == [3, 6]
    assert [h["step"] for h in monitor.history] == [3, 6]
    assert json.loads(json.dumps(monitor.history, allow_nan=False)) == monitor.history
    assert monitor.log(9, model, tokenizer, ready=False) is None and len(monitor.history) == 2
    # The batch is fixed: the inputs diagnose builds from the tokenizer's built-in texts.
    assert len(monitor.inputs) == 2 and {len(s) for s in monitor.inputs} == {16}
    again = monitor.measure(model, tokenizer)
    assert all(again[k] == returned[6][k] for k in again if k != "ssacli/monitor_seconds")


def test_a_level_that_overflows_reads_nan_and_flags_it(tokenizer):
    model = tiny_llama(tokenizer)
    values = SaturationMonitor(probes=["logit-scale:1,1e39"], samples=1, length=8).measure(model, tokenizer)
    assert (
        values["ssacli/overflow@logit-scale:1e+39"] == 1.0 and values["ssacli/overflow@logit-scale:1"] == 0.0
    )
    assert np.isnan(values["ssacli/model/entropy@logit-scale:1e+39"])
    assert np.isfinite(values["ssacli/model/entropy@logit-scale:1"])


def test_driven_by_no_trainer_it_keeps_the_json_record_and_warns_once(tokenizer):
    """Events called by something that is not a Trainer: nothing to log through, so the values go
    where Trainer.log keeps its JSON record (state.log_history), with one warning."""
    callback = ssacli.SaturationCallback(every=2, probes=["key-scale:1,8"], samples=2, length=16)
    state, model = TrainerState(), tiny_llama(tokenizer)
    with pytest.warns(UserWarning, match="found no transformers.Trainer") as caught:
        for step in range(5):
            state.global_step = step
            event = callback.on_train_begin if step == 0 else callback.on_step_end
            event(None, state, TrainerControl(), model=model, processing_class=tokenizer)
    assert [h["step"] for h in state.log_history] == [0, 2, 4] and len(caught) == 1
    assert state.log_history == [{**h, "step": h["step"]} for h in callback.monitor.history]


def test_bad_options_are_refused_in_one_line():
    with pytest.raises(UsageError, match="first argument is the Trainer to log through, not a int"):
        ssacli.SaturationCallback(100)
    with pytest.raises(UsageError, match="interval must be >= 1"):
        SaturationMonitor(every=0)
    with pytest.raises(UsageError, match="unknown monitor metric entropyy"):
        SaturationMonitor(metrics=["entropyy"])
    with pytest.raises(UsageError, match="unknown probe"):
        SaturationMonitor(probes=["key-scal:8"])


# ---- two processes ------------------------------------------------------------------------------------


def test_two_ranks_run_the_probe_together_or_not_at_all(tokenizer, tmp_path):
    import torch.multiprocessing as mp

    folder = tmp_path / "model"
    tiny_llama(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(two_rank_worker, args=(port, str(folder), str(tmp_path)), nprocs=2)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for seen in ranks:
        assert [h["step"] for h in seen["history"]] == [0, 4, 6]  # step 2 skipped on both
        assert seen["agreed"] == [False, True]
    strip = [
        [{k: v for k, v in h.items() if k != "ssacli/monitor_seconds"} for h in r["history"]] for r in ranks
    ]
    assert strip[0] == strip[1]  # same model, same batch: the same numbers on both ranks
