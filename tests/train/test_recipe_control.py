"""The recipe against the right baseline (issue 37): the held-out tokens it measures on and says it
measured, the streamed measures against a direct computation, the softmax control (the same budget
without SSA), its reuse, and the three-way last line of `convert --control`."""

from __future__ import annotations

import json
import math

import pytest
import torch

from ssacli.errors import UsageError
from ssacli.models.loading import load_model
from ssacli.train import recipe_eval
from ssacli.train.recipe import RecipeConfig, softmax_control
from tests.helpers.cli import run_main

MODEL = "builtin:wikitext-softmax"
SMALL = dict(transfer_steps=3, distill_steps=3, eval_every=3, batch_size=2, seq_len=32, heldout_tokens=320)


def config(text, **changes) -> RecipeConfig:
    return RecipeConfig(data=text, **{**SMALL, **changes})


@pytest.fixture(scope="module")
def control(text, tmp_path_factory):
    out = tmp_path_factory.mktemp("control") / "control"
    return out, softmax_control(MODEL, out, config(text), device="cpu")[1]


def direct_measures(student, teacher, ids) -> dict[str, float]:
    """The measures from whole tensors, by their definitions (no chunks, no cache)."""
    log_q = student(ids).double().log_softmax(-1)
    log_p = teacher(ids).double().log_softmax(-1)
    kl = float((log_p.exp() * (log_p - log_q)).sum(-1).mean())
    target = ids[:, 1:].unsqueeze(-1)
    loss = float(-log_q[:, :-1].gather(-1, target).mean())
    original = float(-log_p[:, :-1].gather(-1, target).mean())
    return {"kl": kl, "heldout_loss": loss, "original_loss": original}


@pytest.mark.parametrize(("chunk", "cache"), [(16 * 50, 0), (1 << 25, 1 << 30)])  # one window a chunk, or all
def test_streamed_measures_equal_the_direct_computation(monkeypatch, chunk, cache):
    torch.manual_seed(0)
    vocab, student_w, teacher_w = 50, torch.randn(50, 50), torch.randn(50, 50)
    student = lambda ids: student_w[ids]  # noqa: E731  (a bigram "model": logits from the last token)
    teacher = lambda ids: teacher_w[ids]  # noqa: E731
    ids = torch.randint(0, vocab, (7, 16))
    monkeypatch.setattr(recipe_eval, "CHUNK_ELEMENTS", chunk)
    monkeypatch.setattr(recipe_eval, "TEACHER_CACHE_BYTES", cache)
    held = recipe_eval.HeldOut(ids, asked=112, available=200)
    measure = recipe_eval.HeldOutMeasure(held, vocab)
    expected = direct_measures(student, teacher, ids)
    for _ in range(2):  # the second call reads the teacher from the cache when it is kept
        got = measure(student, teacher)
        for key, value in expected.items():
            assert got[key] == pytest.approx(value, rel=1e-6), key  # the original rounded to float32
        assert got["heldout_ppl"] == pytest.approx(math.exp(expected["heldout_loss"]), rel=1e-9)
    assert (measure.cache is not None) == bool(cache) and len(held.chunks(vocab)) == (1 if cache else 7)


def test_the_record_says_how_many_held_out_tokens_were_measured_and_where_from(control, text):
    _, record = control
    held = record["heldout"]
    assert held["tokens"] == 320 and held["windows"] == 10 and held["seq_len"] == 32  # 320 asked, available
    assert held["available"] > 320 and "no stage trains on" in held["split"]
    whole = config(text, heldout_tokens=10**6, distill_steps=1)
    _, everything = softmax_control(MODEL, control[0].with_name("all"), whole, device="cpu")
    assert everything["heldout"]["tokens"] == held["available"] // 32 * 32  # all of the slice, no more


def test_the_softmax_control_is_the_same_budget_without_ssa_and_loads_in_plain_transformers(
    control, text, ids
):
    from transformers import AutoModelForCausalLM

    out, record = control
    assert record["control"] is True and record["config"]["stages"] == ["distill"]
    assert record["final"]["n_max"] is None and record["final"]["kl"] > 0  # LM loss moved it off the original
    assert [e["stage"] for e in record["evaluations"]] == ["start", "distill", "distill-merged"]
    # it starts as the original, to float32 rounding: 1.3e-9 nats measured with the AVX2 build (MKL and
    # torch limited to AVX2), < 1e-9 on AVX-512; 1e-7 nats still says the two agree to rounding
    assert record["evaluations"][0]["kl"] == pytest.approx(0, abs=1e-7)
    plain = AutoModelForCausalLM.from_pretrained(out)  # a softmax model: no guard
    ours = load_model(str(out), dtype="float32").model
    with torch.no_grad():
        torch.testing.assert_close(
            plain(input_ids=ids).logits, ours(input_ids=ids).logits, rtol=1e-4, atol=1e-5
        )
    with pytest.raises(UsageError, match="lm-weight > 0"):
        softmax_control(MODEL, out.with_name("kl-only"), config(text, lm_weight=0.0), device="cpu")


@pytest.fixture(scope="module")
def ids():
    return torch.randint(3, 1000, (2, 24), generator=torch.Generator().manual_seed(1))


def test_convert_control_reuses_a_matching_control_and_prints_the_three_way_line(
    control, text, tmp_path, monkeypatch, capsys
):
    out, record = control
    args = ["convert", MODEL, "--scorer", "ssa", "--finetune", "--data", text, "--out", str(tmp_path / "ssa"),
            "--transfer-steps", "3", "--distill-steps", "3", "--batch-size", "2", "--seq-len", "32",
            "--device", "cpu", "--control", str(out)]  # fmt: skip
    before = (out / "ssacli.json").stat().st_mtime_ns
    code, stdout, err = run_main([*args], monkeypatch, capsys)
    assert code == 2 and "another budget (heldout_tokens 320 -> 16384)" in err  # the asked budget differs
    # the CLI asks the default 16,384 tokens; a control of 320 is another budget, so train one that matches
    code, stdout, err = run_main([*args[:-1], str(tmp_path / "control")], monkeypatch, capsys)
    assert code == 0, err
    ssa = json.loads((tmp_path / "ssa" / "ssacli.json").read_text())["recipe"]["final"]
    ctl = json.loads((tmp_path / "control" / "ssacli.json").read_text())["recipe"]["final"]
    line = stdout.strip().splitlines()[0]
    assert f"{100 * (ssa['ppl_ratio'] - 1):+.1f} % vs the original" in line
    assert (
        f"{100 * (ssa['heldout_ppl'] / ctl['heldout_ppl'] - 1):+.1f} % vs softmax with the same budget"
        in line
    )
    assert "KL to the original" in line and "(fidelity)" in line and "--max-loss 0.05" in line
    assert "softmax control:" in err  # it was trained ...
    code, stdout2, err = run_main([*args[:-1], str(tmp_path / "control"), "--overwrite"], monkeypatch, capsys)
    assert code == 0 and "softmax control:" not in err  # ... and then reused
    assert stdout2.splitlines()[0] == line
    assert (out / "ssacli.json").stat().st_mtime_ns == before  # a refused control is left alone


def test_control_needs_the_recipe(text, tmp_path, monkeypatch, capsys):
    args = ["convert", MODEL, "--scorer", "ssa", "--finetune", "--data", text, "--stages", "lm",
            "--control", str(tmp_path / "c"), "--out", str(tmp_path / "o")]  # fmt: skip
    code, _, err = run_main(args, monkeypatch, capsys)
    assert code == 2 and "--control applies to the conversion recipe" in err
