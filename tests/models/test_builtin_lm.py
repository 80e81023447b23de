"""The bundled language models, builtin:wikitext-softmax and builtin:wikitext-ssa: they load as what
they say they are (plain softmax; SSA with the authors' preset and its trained parameters), from
float16 files without losing a bit; diagnose measures their own attention; convert and report run
on them. scripts/bundle_lm.py bundles a finished run (a tiny one trained here) within its tolerances
and refuses an unfinished one."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaForCausalLM

import ssacli
from ssacli import make_scorer
from ssacli.errors import UsageError
from ssacli.models.checkpoint import SCORER_FILE, WEIGHTS_FILE
from ssacli.models.loading import builtin_names, load_model, resolve_model_path
from tests.helpers.cli import run_main

ROOT = Path(__file__).resolve().parents[2]
LMS = {"wikitext-softmax": "softmax", "wikitext-ssa": "ssa:preset=authors"}
# Wikipedia-style English, like the models' training text (the models never saw this paragraph).
TEXT = (
    "The castle was built in the 12th century by the first earl , who held the land from the king . "
    "It was rebuilt in stone after a fire in 1204 , and the new walls were finished in 1230 . During "
    "the war the garrison held out for two years , but the castle was taken in 1646 and the walls were "
    "pulled down . The ruins are now a listed building and are open to the public in the summer . "
) * 4


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Small models gain nothing from a second thread and lose a lot when another process holds a
    core: one thread keeps these tests' time steady."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def token_rows(loaded, rows: int, length: int) -> list[list[int]]:
    ids = loaded.tokenizer(TEXT, verbose=False)["input_ids"]
    assert len(ids) >= rows * length
    return [ids[i * length : (i + 1) * length] for i in range(rows)]


def plain_transformers(name: str) -> LlamaForCausalLM:
    """The bundled weights through transformers alone (no ssacli: softmax attention)."""
    folder = resolve_model_path(f"builtin:{name}")
    return LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()


# ---- what they are ---------------------------------------------------------------------------------


def test_the_lms_are_listed_next_to_the_icl_models():
    names = set(builtin_names())
    assert set(LMS) <= names and "every-softmax" in names
    with pytest.raises(UsageError, match="builtin:wikitext-ssa"):
        resolve_model_path("builtin:wikitext")


@pytest.mark.parametrize("name", sorted(LMS))
def test_stored_in_float16_under_2_mb_and_loaded_as_float32_without_loss(name):
    folder = resolve_model_path(f"builtin:{name}")
    assert sum(f.stat().st_size for f in folder.iterdir()) <= 2_000_000
    assert (folder / "RECIPE.md").is_file() and not (folder / "trainer.safetensors").exists()
    stored = load_file(folder / WEIGHTS_FILE)  # read here, not through ssacli
    assert {v.dtype for v in stored.values()} == {torch.float16}
    loaded = load_model(f"builtin:{name}", device="cpu")  # --dtype auto: float32 on CPU
    assert (loaded.kind, loaded.family) == ("causal", "llama") and loaded.tokenizer is not None
    state = loaded.model.state_dict()
    for key, value in stored.items():
        assert state[key].dtype == torch.float32 and torch.equal(state[key], value.float()), key
    requested = load_model(f"builtin:{name}", device="cpu", dtype="float16")
    assert requested.model.get_input_embeddings().weight.dtype == torch.float16


def test_the_softmax_lm_is_plain_softmax():
    loaded = load_model("builtin:wikitext-softmax", device="cpu")
    assert {s.spec for s in ssacli.scorers_of(loaded.model).values()} == {"softmax"}
    ids = torch.tensor(token_rows(loaded, 2, 48))
    with torch.no_grad():
        ours, reference = loaded.model(ids).logits, plain_transformers("wikitext-softmax")(ids).logits
    torch.testing.assert_close(ours, reference, atol=1e-4, rtol=1e-4)


def test_the_ssa_lm_has_the_authors_scorer_with_its_trained_parameters():
    loaded = load_model("builtin:wikitext-ssa", device="cpu")
    scorers = ssacli.scorers_of(loaded.model)
    heads = loaded.model.config.num_attention_heads
    fresh = make_scorer(LMS["wikitext-ssa"], num_heads=heads)  # the preset, untrained
    saved = load_file(resolve_model_path("builtin:wikitext-ssa") / SCORER_FILE)
    assert len(scorers) == loaded.model.config.num_hidden_layers
    moved = []
    for module, scorer in scorers.items():
        assert scorer.name == "ssa" and scorer.spec == fresh.spec
        # the authors' kernel: one n per layer, learned; b fixed at the preset's value
        assert scorer.n_raw.shape == scorer.b_raw.shape == (1,)
        assert scorer.n_raw.requires_grad and not scorer.b_raw.requires_grad
        assert torch.equal(scorer.b, fresh.b)
        for param in ("b_raw", "n_raw"):
            assert torch.equal(getattr(scorer, param), saved[f"{module}.ssacli_scorer.{param}"])
        moved.append(abs(float(scorer.n.detach() - fresh.n.detach())))
    assert max(moved) > 1e-3  # training moved n away from its initial 1.5
    ids = torch.tensor(token_rows(loaded, 2, 48))
    with torch.no_grad():  # the scorer is in use: the same weights with softmax predict otherwise
        ours, softmax = loaded.model(ids).logits, plain_transformers("wikitext-ssa")(ids).logits
    assert (ours - softmax).abs().max() > 0.1


# ---- diagnose, convert, report ------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(LMS))
def test_diagnose_measures_the_lm_s_own_attention(name):
    loaded = load_model(f"builtin:{name}", device="cpu")
    ids = token_rows(loaded, 2, 40)
    result = ssacli.diagnose(loaded, ["logit-scale:1"], inputs=ids)
    assert result.scorer == LMS[name]
    # Reference: the attention weights the model returns (softmax: transformers' eager path alone),
    # max per row over the rows with at least two visible keys, averaged per layer and head.
    reference = plain_transformers(name) if name.endswith("softmax") else loaded.model
    with torch.no_grad():
        maps = reference(torch.tensor(ids), output_attentions=True).attentions
    expected = torch.stack([m[:, :, 1:, :].max(-1).values.double().mean((0, 2)) for m in maps])
    measured = result.probe("logit-scale").metrics["max_weight"][0]
    np.testing.assert_allclose(measured, expected.numpy(), atol=1e-5)


def test_cli_diagnose_builtin_wikitext_ssa(tmp_path, monkeypatch, capsys):
    out = tmp_path / "ssa.json"
    args = ["diagnose", "builtin:wikitext-ssa", "--samples", "2", "--length", "32", "--json", str(out)]
    code, stdout, stderr = run_main([*args, "--quiet", "--device", "cpu"], monkeypatch, capsys)
    assert code == 0, stderr
    data = json.loads(out.read_text())
    assert data["model"] == "builtin:wikitext-ssa" and data["scorer"] == LMS["wikitext-ssa"]
    assert data["family"] == "llama" and len(data["layers"]) == 4 and data["heads"] == [4, 4, 4, 4]
    measured = [p for p in data["probes"] if not p.get("skipped")]
    assert len(measured) >= 4
    for probe in measured:
        first = np.array(probe["metrics"]["max_weight"][0], dtype=float)
        assert first.shape == (4, 4) and np.isfinite(first).all() and ((first > 0) & (first <= 1)).all()


def test_convert_and_report_on_builtin_wikitext_softmax(tmp_path, monkeypatch, capsys):
    converted, report, text = tmp_path / "ssa", tmp_path / "report.json", tmp_path / "text.txt"
    text.write_text(TEXT)
    args = ["convert", "builtin:wikitext-softmax", "--scorer", "ssa:init=faithful", "--out", str(converted)]
    code, stdout, stderr = run_main([*args, "--text", str(text), "--device", "cpu"], monkeypatch, capsys)
    assert code == 0, stderr
    assert json.loads((converted / "ssacli.json").read_text())["scorer"].startswith("ssa:init=faithful")
    args = ["report", "builtin:wikitext-softmax", str(converted), "--text-id", str(text), "--samples", "1",
            "--probe", "logit-scale:1,8", "--seq-len", "64", "--json", str(report), "--quiet"]  # fmt: skip
    code, stdout, stderr = run_main([*args, "--device", "cpu"], monkeypatch, capsys)
    assert code == 0, stderr
    data = json.loads(report.read_text())
    assert data["before"]["scorer"] == "softmax" and data["after"]["scorer"].startswith("ssa:init=faithful")
    # each side's LM loss is that model's, as language_model_loss measures it directly
    for side, ref in (("before", "builtin:wikitext-softmax"), ("after", str(converted))):
        direct = ssacli.language_model_loss(load_model(ref, device="cpu"), TEXT, seq_len=64)
        assert data["measurements"][side]["lm_id"]["nll"] == pytest.approx(direct["nll"], abs=1e-6)
    nll = {side: data["measurements"][side]["lm_id"]["nll"] for side in ("before", "after")}
    assert abs(nll["after"] - nll["before"]) < 0.05  # faithful: softmax in practice at these logits


# ---- scripts/bundle_lm.py on a tiny run trained here -----------------------------------------------


def load_script():
    spec = importlib.util.spec_from_file_location("bundle_lm", ROOT / "scripts" / "bundle_lm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory):
    """A finished `ssacli train` run (SSA, authors' preset) in STUDY/runs/ssa-s0, and its plan."""
    from typer.testing import CliRunner

    from ssacli.cli import app

    root = tmp_path_factory.mktemp("study")
    (root / "train.txt").write_text(TEXT * 6)
    (root / "id.txt").write_text(TEXT)
    model = {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 2,
             "num_key_value_heads": 2, "hidden_size": 32, "intermediate_size": 64,
             "max_position_embeddings": 16, "tie_word_embeddings": True}  # fmt: skip
    (root / "model-config.json").write_text(json.dumps(model))
    plan = {"data": str(root / "train.txt"), "id_text": str(root / "id.txt"), "model": model,
            "vocab_size": 300, "seq_len": 16, "steps": 3, "lr": 0.001, "batch_size": 2, "seeds": 1,
            "arms": [{"label": "ssa", "spec": "ssa:preset=authors"}], "max_tokens": 256}  # fmt: skip
    (root / "plan.json").write_text(json.dumps(plan))
    args = ["train", "--data", plan["data"], "--size", str(root / "model-config.json"), "--scorer",
            "ssa:preset=authors", "--steps", "3", "--lr", "0.001", "--batch-size", "2", "--seq-len", "16",
            "--vocab-size", "300", "--seed", "0", "--device", "cpu", "--quiet",
            "--out", str(root / "runs" / "ssa-s0")]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, (result.output, result.exception)
    return root


def bundle_args(study: Path, plan: Path, *pairs: str) -> list[str]:
    return ["--plan", str(plan), "--study", str(study), "--package", str(study / "package"), *pairs]


def test_bundle_script_stores_a_finished_run_in_float16_within_its_tolerances(tiny_study):
    script = load_script()
    script.main(bundle_args(tiny_study, tiny_study / "plan.json", "tiny-ssa=ssa-s0"))
    run, folder = tiny_study / "runs" / "ssa-s0", tiny_study / "package" / "tiny-ssa"
    assert {v.dtype for v in load_file(folder / WEIGHTS_FILE).values()} == {torch.float16}
    for name in (SCORER_FILE, "ssacli.json", "tokenizer.json"):  # copied byte for byte
        assert (folder / name).read_bytes() == (run / name).read_bytes(), name
    assert not (folder / "trainer.safetensors").exists()
    # measured here: the bundle (loaded as float32) against the float32 run, logit by logit
    full, small = load_model(str(run), device="cpu"), load_model(str(folder), device="cpu")
    ids = torch.tensor(token_rows(full, 4, 16))
    with torch.no_grad():
        a, b = full.model(ids).logits.double(), small.model(ids).logits.double()
    relative = float((a - b).pow(2).mean().sqrt() / a.pow(2).mean().sqrt())
    assert 0 < relative <= script.TOLERANCES["logit_rms_rel"]  # rounded, but within the tolerance
    recipe = (folder / "RECIPE.md").read_text()
    heldout = json.loads((run / "ssacli.json").read_text())["training"]["heldout"][-1][1]
    assert "ssa:preset=authors" in recipe and f"{heldout:.4f}" in recipe
    assert f"| total | {sum(f.stat().st_size for f in folder.iterdir()):,} |" in recipe


@pytest.mark.parametrize(
    "change, message", [({"steps": 5}, "not finished"), ({"lr": 0.002}, "not the plan's")]
)
def test_bundle_script_refuses_a_run_the_plan_did_not_finish(tiny_study, tmp_path, change, message):
    plan = json.loads((tiny_study / "plan.json").read_text())
    (tmp_path / "plan.json").write_text(json.dumps({**plan, **change}))
    with pytest.raises(SystemExit, match=message):
        load_script().main(bundle_args(tiny_study, tmp_path / "plan.json", "refused=ssa-s0"))
    assert not (tiny_study / "package" / "refused").exists()


def test_bundle_script_tolerances_fail_on_nan_and_on_excess():
    script = load_script()
    within = {key: limit / 2 for key, limit in script.TOLERANCES.items()}
    assert script.check_fidelity(within) == []
    assert len(script.check_fidelity({**within, "nll_abs_diff": float("nan")})) == 1
    assert len(script.check_fidelity({key: 3 * v for key, v in within.items()})) == 3


def test_bundle_script_names_the_steps_where_a_run_was_resumed():
    training = {"config": {"checkpoint_every": 125}, "steps": 500,
                "trajectory": [{"step": s} for s in (0, 43, 125, 250, 300, 375, 500)]}  # fmt: skip
    assert load_script().interruptions(training) == [43, 300]
