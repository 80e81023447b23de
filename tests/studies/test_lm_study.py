"""The language-model study (ssacli.quality.lm_study) on a tiny budget: two arms × two seeds of a
tiny Llama trained as `ssacli train` trains it, on text this test writes, evaluated (ID/OOD perplexity
at 1× and 2× the context, minimal pairs, diagnose), paired, reported (ssacli.report.lm_study, and
again through studies/lm/run.py --from-results), and resumed without training again."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest

from ssacli.errors import UsageError
from ssacli.quality import lm_study
from ssacli.report.lm_study import write_report

ROOT = Path(__file__).resolve().parents[2]


def words(seed: int, count: int, vocabulary: list[str]) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(vocabulary) for _ in range(count)) + "\n"


@pytest.fixture()
def tiny_plan(tmp_path):
    common = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "house", "of", "it"]
    (tmp_path / "train.txt").write_text("".join(words(s, 60, common) for s in range(30)))
    (tmp_path / "id.txt").write_text("".join(words(100 + s, 60, common) for s in range(4)))
    (tmp_path / "ood.txt").write_text(
        "".join(words(200 + s, 60, ["thou", "art", "hath", "doth", "ye"]) for s in range(4))
    )
    blimp = tmp_path / "blimp"
    blimp.mkdir()
    for name in ("agreement", "islands"):
        records = [{"sentence_good": "the cat sat on a mat", "sentence_bad": "cat the mat a on sat"}] * 3
        (blimp / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    plan = {
        "data": str(tmp_path / "train.txt"),
        "id_text": str(tmp_path / "id.txt"),
        "ood_text": str(tmp_path / "ood.txt"),
        "blimp": str(blimp),
        "model": {"model_type": "llama", "num_hidden_layers": 1, "num_attention_heads": 2,
                  "num_key_value_heads": 2, "hidden_size": 16, "intermediate_size": 32,
                  "max_position_embeddings": 16, "tie_word_embeddings": True},
        "vocab_size": 300,
        "seq_len": 16,
        "steps": 2,
        "lr": 0.001,
        "batch_size": 2,
        "seeds": 2,
        "arms": [{"label": "softmax", "spec": "softmax"}, {"label": "ssa", "spec": "ssa:preset=authors"}],
        "contexts": [1, 2],
        "max_tokens": 256,
        "diagnose_args": ["--samples", "1", "--length", "8", "--probe", "logit-scale:1,4"],
    }  # fmt: skip
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def test_tiny_lm_study_trains_evaluates_pairs_and_resumes(tmp_path, tiny_plan):
    out = tmp_path / "study"
    returned = lm_study.run_study(tiny_plan, out)  # jobs > 1: tests/test_study.py
    write_report(returned, tmp_path / "doc")
    results = json.loads((out / "results.json").read_text())
    assert results == returned
    assert len(results["runs"]) == 4
    metrics = results["runs"][0]["metrics"]
    for key in ("ppl id@1x", "ppl id@2x", "ppl ood@1x", "ppl ood@2x", "blimp mean", "blimp agreement"):
        assert key in metrics, sorted(metrics)
    evaluation = json.loads((out / "runs" / "ssa-s1" / "eval.json").read_text())
    assert evaluation["perplexity"]["id@2x"]["seq_len"] == 32  # twice the 16 trained positions
    assert "error" not in evaluation["diagnose"], evaluation["diagnose"]
    assert 0 <= metrics["collapse logit-scale"] <= 1
    # the paired row is the per-seed difference of the runs' own numbers
    by = {(r["label"], r["seed"]): r["metrics"] for r in results["runs"]}
    (row,) = [r for r in results["paired"] if r["metric"] == "ppl ood@2x"]
    expected = [by[("ssa", s)]["ppl ood@2x"] - by[("softmax", s)]["ppl ood@2x"] for s in (0, 1)]
    assert row["differences"] == pytest.approx(expected) and row["lower_is_better"]
    assert row["ci_low"] <= row["mean_difference"] <= row["ci_high"]
    # the same seed gives both arms the same tokenizer (it depends on the data only)
    tokenizers = [(out / "runs" / n / "tokenizer.json").read_text() for n in ("softmax-s0", "ssa-s0")]
    assert tokenizers[0] == tokenizers[1]
    tables = (tmp_path / "doc" / "tables.md").read_text()
    assert "ssa − softmax" in tables and "ppl id@2x" in tables
    assert (tmp_path / "doc" / "lm-context.png").stat().st_size > 1000
    assert (tmp_path / "doc" / "lm-paired.png").stat().st_size > 1000
    # the command line renders the same tables from the results.json (its main(), in this process)
    spec = importlib.util.spec_from_file_location("lm_run", ROOT / "studies" / "lm" / "run.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(["--report", str(tmp_path / "cli"), "--from-results", str(out / "results.json")])
    assert (tmp_path / "cli" / "tables.md").read_text() == tables
    # resumable: a second call trains nothing and evaluates nothing
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/eval.json")}
    weights = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/model.safetensors")}
    assert lm_study.run_study(tiny_plan, out)["runs"] == results["runs"]
    assert stamps == {p: p.stat().st_mtime_ns for p in out.glob("runs/*/eval.json")}
    assert weights == {p: p.stat().st_mtime_ns for p in out.glob("runs/*/model.safetensors")}


def test_a_plan_asking_diagnose_for_an_option_the_study_does_not_pass_is_refused(tmp_path, tiny_plan):
    plan = json.loads(tiny_plan.read_text())
    plan["diagnose_args"] = ["--samples", "1", "--html", "x.html"]
    tiny_plan.write_text(json.dumps(plan))
    with pytest.raises(UsageError, match="--html"):
        lm_study.run_study(tiny_plan, tmp_path / "study")
    assert not (tmp_path / "study" / "runs").exists()


def test_the_committed_lm_plan_is_paired():
    plan = lm_study.load_plan(ROOT / "docs" / "results" / "lm-plan.json")
    specs = [a["spec"] for a in plan["arms"]]
    assert specs[0] == "softmax" and "ssa:preset=authors" in specs and len(specs) >= 3
    assert plan["seeds"] >= 3 and plan["reference"] == "softmax"
    assert plan["contexts"] == [1, 2, 4]
    assert plan.get("attention") in (None, "auto", "eager", "fused")
