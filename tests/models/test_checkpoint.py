"""Checkpoints written by the previous release (fixtures/previous-release, made by
scripts/make_previous_release_fixture.py at the commit its README names) load with the current code,
compute what that release computed, read back the same ssacli.json, and resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import ssacli
from ssacli.errors import InputError
from ssacli.icl.train import TrainConfig, train
from ssacli.models import checkpoint
from ssacli.models.checkpoint import (
    ICL_FORMAT,
    MODEL_FORMAT,
    SCORER_FILE,
    folder_format,
    read_icl_meta,
    read_meta,
    restore_trainer_state,
    training_record,
)
from ssacli.models.optim import legacy_order, make_optimizer
from ssacli.train.finetune import FinetuneConfig, finetune

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "previous-release"
CONVERTED, ICL = FIXTURE / "converted-llama-ssa", FIXTURE / "icl-every-ssa"
TOLERANCE = dict(rtol=1e-5, atol=1e-5)  # the same computation; only thread counts may differ


@pytest.fixture(scope="module")
def expected():
    return load_file(FIXTURE / "expected_outputs.safetensors")


def on_disk(folder: Path) -> dict:
    return json.loads((folder / "ssacli.json").read_text())


@torch.inference_mode()
def llama_logits(model, ids):
    return model(input_ids=ids, use_cache=False).logits.float()


def test_converted_folder_computes_what_the_previous_release_computed(expected):
    loaded = ssacli.load_model(str(CONVERTED), device="cpu")
    assert (loaded.kind, loaded.family, loaded.config.ssacli_scorer) == ("causal", "llama", "ssa")
    ids = expected["converted.input_ids"]
    torch.testing.assert_close(llama_logits(loaded.model, ids), expected["converted.logits"], **TOLERANCE)
    # The same weights with plain softmax compute something else: the saved scorer parameters (SSA's
    # fine-tuned b and n) were restored, and they matter.
    plain = AutoModelForCausalLM.from_pretrained(CONVERTED, attn_implementation="eager").eval()
    assert not torch.allclose(llama_logits(plain, ids), expected["converted.logits"], **TOLERANCE)


def test_icl_folder_computes_what_the_previous_release_computed(expected):
    loaded = ssacli.load_model(str(ICL), device="cpu")
    assert (loaded.kind, loaded.model.spec.task, loaded.model.spec.scorer) == ("icl", "every", "ssa")
    with torch.inference_mode():
        predictions = loaded.model(expected["icl.tokens"]).float()
    torch.testing.assert_close(predictions, expected["icl.predictions"], **TOLERANCE)


def test_ssacli_json_of_both_formats_reads_back():
    assert folder_format(CONVERTED) == MODEL_FORMAT and folder_format(ICL) == ICL_FORMAT
    assert read_meta(CONVERTED) == on_disk(CONVERTED)
    assert read_icl_meta(ICL) == on_disk(ICL)
    assert read_meta(ICL) is None and read_meta(ICL, ICL_FORMAT) == on_disk(ICL)
    assert training_record(CONVERTED) == on_disk(CONVERTED)["training"]
    assert training_record(CONVERTED)["step"] == 4
    assert training_record(ICL) is None  # icl train's record is the spec's, not a fine-tuning run's
    assert ssacli.load_model(str(ICL), device="cpu").model.spec.training == on_disk(ICL)["training"]


def test_saving_a_previous_release_folder_writes_the_same_format(tmp_path, expected):
    loaded = ssacli.load_model(str(CONVERTED), device="cpu")
    old = on_disk(CONVERTED)
    meta = {k: v for k, v in old.items() if k not in ("format", "format_version", "scorer")}
    out = ssacli.save_model(loaded, tmp_path / "again", meta=meta)
    assert on_disk(out) == old
    written = {p.name for p in out.iterdir()}
    assert written == {p.name for p in CONVERTED.iterdir()} - {"trainer.safetensors"}
    reloaded = ssacli.load_model(str(out), device="cpu")
    ids = expected["converted.input_ids"]
    torch.testing.assert_close(llama_logits(reloaded.model, ids), expected["converted.logits"], **TOLERANCE)


def test_a_previous_release_fine_tuning_run_resumes(tmp_path, monkeypatch):
    out = tmp_path / "converted-llama-ssa"
    shutil.copytree(CONVERTED, out)
    shutil.copy(FIXTURE / "corpus.txt", tmp_path / "corpus.txt")
    monkeypatch.chdir(tmp_path)  # the run recorded --data corpus.txt
    old = training_record(out)
    config = FinetuneConfig(**{**old["config"], "steps": 6})
    finetune(str(out), config, out, resume=True, device="cpu")
    record = training_record(out)
    assert record["step"] == 6 and record["tokens"] == old["tokens"] * 6 // 4
    assert record["history"][: len(old["history"])] == old["history"]
    assert record["heldout"][: len(old["heldout"])] == old["heldout"]


def test_previous_release_trainer_state_restores_into_an_optimizer():
    model = ssacli.load_model(str(ICL), device="cpu").model
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer, generator = torch.optim.Adam(params), torch.Generator()
    step, extra = restore_trainer_state(ICL, optimizer, generator=generator)
    saved = load_file(ICL / "trainer.safetensors")
    assert step == 4 and extra == {}
    assert torch.equal(generator.get_state(), saved["generator"])
    restored = optimizer.state_dict()["state"]
    assert restored  # every parameter that had a gradient has its moments back
    for index, values in restored.items():
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(values[key], saved[f"adam.{index}.{key}"], rtol=0, atol=0)


def test_previous_release_moments_land_on_their_parameters_in_the_grouped_layout():
    # The file indexes Adam's moments in the old one-group order; the optimizer now groups the
    # scorer apart (ssacli.models.optim), so every moment must move to its parameter's new index.
    model = ssacli.load_model(str(ICL), device="cpu").model
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(model, params, lr=1e-3, scorer_lr=None)
    assert [g["name"] for g in optimizer.param_groups][-1] == "scorer"  # the order did change
    restore_trainer_state(ICL, optimizer, saved_order=legacy_order(model, params, grouped=False))
    saved = load_file(ICL / "trainer.safetensors")
    moved = 0
    for old_index, param in enumerate(params):
        if f"adam.{old_index}.exp_avg" in saved:
            restored = optimizer.state[param]
            expected_moment = saved[f"adam.{old_index}.exp_avg"]
            torch.testing.assert_close(restored["exp_avg"], expected_moment, rtol=0, atol=0)
            moved += 1
    assert moved > 0
    assert {g["base_lr"] for g in optimizer.param_groups} == {1e-3}  # the scorer at the model's rate


def test_a_previous_release_icl_run_resumes(tmp_path):
    out = tmp_path / "icl-every-ssa"
    shutil.copytree(ICL, out)
    old = on_disk(ICL)["training"]
    model = train(TrainConfig(**{**old["config"], "steps": 6}), out, resume=True, device="cpu")
    assert model.spec.training["step"] == 6
    assert model.spec.training["history"][: len(old["history"])] == old["history"]
    assert int(load_file(out / "trainer.safetensors")["step"]) == 6


# ---- a saved scorer file that cannot be read ------------------------------------------------------------


@pytest.fixture
def converted_copy(tmp_path) -> Path:
    folder = tmp_path / "converted"
    shutil.copytree(CONVERTED, folder)
    return folder


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_a_truncated_or_garbage_scorer_file_is_an_input_error(converted_copy, damage):
    file = converted_copy / SCORER_FILE
    whole = file.read_bytes()
    file.write_bytes(
        {"truncated": whole[: len(whole) // 2], "garbage": b"\xff" * len(whole), "empty": b""}[damage]
    )
    with pytest.raises(InputError, match="corrupt or truncated"):
        ssacli.load_model(str(converted_copy), device="cpu")


@pytest.mark.parametrize("bug", [RuntimeError, TypeError, KeyError])
def test_a_bug_while_reading_the_scorer_file_is_not_blamed_on_the_file(converted_copy, monkeypatch, bug):
    """Only what safetensors and the OS raise for a bad file is an input error (exit 4); an error of
    ours propagates as itself (exit 1, a bug)."""

    def broken(*args, **kwargs):
        raise bug("a bug in the reader")

    monkeypatch.setattr(checkpoint, "load_file", broken)
    with pytest.raises(bug, match="a bug in the reader"):
        ssacli.load_model(str(converted_copy), device="cpu")
