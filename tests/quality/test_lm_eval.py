"""Benchmarks through lm-evaluation-harness (ssacli.lm_eval, `ssacli report --lm-eval`), offline.

The task is defined here: an lm-eval task YAML (``dataset_path: json``) over a jsonl file of the 40
built-in agreement pairs written to tmp_path, multiple choice between the good and the bad sentence
with an empty context, so lm-eval scores each choice as log P(sentence | BOS), summed over its
tokens: exactly what ``ssacli.minimal_pairs(..., scores=True)`` computes with ssacli's own forward.
BEFORE is the bundled softmax LM, AFTER its conversion to SSA. References are computed here from
those public measures and plain formulas (standard errors as sd / √n with n − 1), never read back
from the report.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys

import pytest
from typer.testing import CliRunner

import ssacli
from ssacli.cli import app
from ssacli.errors import InputError, UsageError
from ssacli.models.loading import load_model
from ssacli.quality.builtin import BUILTIN_PAIRS
from ssacli.quality.harness import paired_rows
from tests.helpers.cli import run_main

pytest.importorskip("lm_eval")  # in the dev extra; the missing-extra error is tested by hiding it

runner = CliRunner()
BEFORE = "builtin:wikitext-softmax"
AFTER_SCORER = "ssa:init=faithful,m=32"  # a fixed m: no m=auto search, the test stays fast
RECORDS = [r for records in BUILTIN_PAIRS.values() for r in records]
TASK = "ssacli_agreement"


def task_yaml(folder, data, name=TASK, dataset_path="json") -> str:
    kwargs = f"  data_files:\n    test: {data}\n  cache_dir: {folder / 'hf-cache'}\n" if data else ""
    text = (
        f"task: {name}\ndataset_path: {dataset_path}\n"
        + (f"dataset_kwargs:\n{kwargs}" if kwargs else "")
        + "test_split: test\noutput_type: multiple_choice\n"
        'doc_to_text: ""\ntarget_delimiter: ""\n'
        'doc_to_choice: "{{[sentence_good, sentence_bad]}}"\ndoc_to_target: 0\n'
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
    )
    path = folder / f"{name}.yaml"
    path.write_text(text)
    return str(path)


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lm_eval")
    data = folder / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    after_dir = folder / "wikitext-ssa32"
    ssacli.convert(BEFORE, AFTER_SCORER, out=after_dir, device="cpu")
    return {"folder": folder, "yaml": task_yaml(folder, data), "after": str(after_dir)}


def reference_scores(ref: str) -> list[tuple[float, float]]:
    """(log P(good), log P(bad)) per pair, from ssacli's own log-prob computation."""
    loaded = load_model(ref, device="cpu")
    scores = ssacli.minimal_pairs(loaded, RECORDS, scores=True)["files"]["records"]["scores"]
    return [tuple(s) for s in scores]


def standard_error(values: list[float]) -> float:
    return statistics.stdev(values) / math.sqrt(len(values))


def test_report_runs_lm_eval_on_before_and_after_with_paired_difference(bench, tmp_path):
    out, html = tmp_path / "r.json", tmp_path / "r.html"
    args = ["report", BEFORE, bench["after"], "--lm-eval", bench["yaml"], "--no-builtin", "--samples", "1",
            "--probe", "outlier:1", "--device", "cpu", "--json", str(out), "--html", str(html)]  # fmt: skip
    result = runner.invoke(app, args, env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    (row,) = report["lm_eval"]["rows"]
    assert (row["task"], row["metric"], row["n"]) == (TASK, "acc", len(RECORDS))

    scores = {"before": reference_scores(BEFORE), "after": reference_scores(bench["after"])}
    correct = {side: [1.0 if good > bad else 0.0 for good, bad in s] for side, s in scores.items()}
    for side in ("before", "after"):
        run = report["measurements"][side]["lm_eval"]
        assert run["attn_implementation"] == "ssacli"  # transformers dispatched to ssacli's function
        items = sorted(run["tasks"][TASK]["items"], key=lambda i: i["doc_id"])
        assert [i["doc_id"] for i in items] == list(range(len(RECORDS)))
        # the scorer ran inside lm-eval: its per-item log-likelihoods are ssacli's own
        for item, expected in zip(items, scores[side]):
            assert item["loglikelihoods"] == pytest.approx(expected, rel=1e-5), (side, item["doc_id"])
        assert row[side] == pytest.approx(statistics.fmean(correct[side]), rel=1e-12)
        assert row[f"{side}_stderr"] == pytest.approx(standard_error(correct[side]), rel=1e-9)
    assert report["measurements"]["after"]["lm_eval"]["scorer"].startswith("ssa:init=faithful")
    # and it is not softmax's: the conversion moved the log-likelihoods far beyond the tolerance
    moved = max(abs(a - b) for pa, pb in zip(scores["before"], scores["after"]) for a, b in zip(pa, pb))
    assert moved > 1e-3

    differences = [a - b for a, b in zip(correct["after"], correct["before"])]
    assert row["delta"] == pytest.approx(statistics.fmean(differences), abs=1e-12)
    if any(differences):
        assert row["paired_stderr"] == pytest.approx(standard_error(differences), rel=1e-9)
    else:  # identical per-item outcomes: no noise between the two, and the paired error says so
        assert row["paired_stderr"] == 0
    assert "benchmarks (lm-evaluation-harness)" in result.output
    assert f"{row['delta']:+.4f} ± {row['paired_stderr']:.4f}" in result.output
    page = html.read_text()
    assert "benchmarks (lm-evaluation-harness)" in page
    assert f"{row['after']:.4f} ± {row['after_stderr']:.4f}" in page


def test_lm_eval_calls_the_scorer_of_every_layer(bench):
    """Under the eager backend each SSA scorer module is called in lm-eval's forwards, and the
    log-likelihoods still equal ssacli's (which took the fused kernel): one model, two kernels.
    In float64, to 1e-5 absolute: a float32 sum of ~150 nats is exact only to about one ulp
    (1.5e-5), so the float32 comparisons above are relative."""
    loaded = load_model(bench["after"], device="cpu", dtype="float64")
    calls = dict.fromkeys(ssacli.scorers_of(loaded.model), 0)
    assert len(calls) == loaded.model.config.num_hidden_layers

    def counter(name):
        def hook(module, args, output):
            calls[name] += 1

        return hook

    handles = [s.register_forward_hook(counter(n)) for n, s in ssacli.scorers_of(loaded.model).items()]
    try:
        with ssacli.attention_backend(loaded.model, "eager"):
            run = ssacli.lm_eval(loaded, [bench["yaml"]])
    finally:
        for handle in handles:
            handle.remove()
    assert all(count > 0 for count in calls.values()), calls
    items = sorted(run["tasks"][TASK]["items"], key=lambda i: i["doc_id"])
    expected = ssacli.minimal_pairs(loaded, RECORDS, scores=True)["files"]["records"]["scores"]
    assert len(items) == len(expected) == len(RECORDS)
    for item, reference in zip(items, expected):
        assert item["loglikelihoods"] == pytest.approx(reference, rel=0, abs=1e-5)


def test_task_data_not_cached_offline_is_one_clear_error(bench, tmp_path, monkeypatch, capsys):
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)  # ssacli itself makes the run offline
    hub_task = task_yaml(tmp_path, None, name="not_cached", dataset_path="ssacli-tests/not-cached")
    with pytest.raises(InputError, match="lm-eval task 'not_cached'.*cannot be had offline"):
        ssacli.lm_eval(BEFORE, hub_task, offline=True)
    assert "HF_HUB_OFFLINE" not in os.environ  # restored afterwards
    missing = task_yaml(tmp_path, tmp_path / "absent.jsonl", name="missing_file")
    out = tmp_path / "r.json"
    args = ["report", BEFORE, bench["after"], "--lm-eval", missing, "--json", str(out)]
    code, _, stderr = run_main(args, monkeypatch, capsys)
    assert code == 4, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "lm-eval task 'missing_file'" in lines[0] and "absent.jsonl" in lines[0]
    assert not out.exists()


def test_missing_extra_is_one_clear_error(bench, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # as if lm-eval were not installed
    out = tmp_path / "r.json"
    args = ["report", BEFORE, bench["after"], "--lm-eval", "arc_easy", "--json", str(out)]
    code, _, stderr = run_main(args, monkeypatch, capsys)
    assert code == 2, stderr
    assert stderr.strip() == (
        'error: --lm-eval needs lm-evaluation-harness, which is not installed: pip install "ssacli[eval]"'
    )
    assert not out.exists()
    with pytest.raises(UsageError, match=r"ssacli\[eval\]"):
        ssacli.lm_eval(BEFORE, "arc_easy")


def test_paired_rows_by_hand():
    """Δ and the paired SE from per-item values on the same documents; a score that is not the
    mean of its items (e.g. a corpus-level F1) gets no paired error and says why."""

    def run(acc, f1, f1_score):
        items = [{"doc_id": i, "metrics": {"acc": a, "f1": f}} for i, (a, f) in enumerate(zip(acc, f1))]
        metrics = {"acc": {"value": statistics.fmean(acc), "stderr": 0.1, "better": "higher"},
                   "f1": {"value": f1_score, "stderr": None, "better": "higher"}}  # fmt: skip
        return {"tasks": {"t": {"metrics": metrics, "items": items}}}

    before = run([1, 0, 1, 1], [0.5, 0.5, 0.5, 0.5], 0.4)
    after = run([1, 1, 0, 1], [0.5, 1.0, 0.0, 0.5], 0.45)
    rows = {r["metric"]: r for r in paired_rows(before, after)}
    d = [0, 1, -1, 0]
    assert rows["acc"]["delta"] == pytest.approx(0.0, abs=1e-15)
    assert rows["acc"]["paired_stderr"] == pytest.approx(math.sqrt((2 / 3) / 4), rel=1e-12)
    assert rows["acc"]["paired_stderr"] == pytest.approx(standard_error(d), rel=1e-12)
    assert rows["acc"]["p"] == pytest.approx(1.0)
    assert rows["f1"]["paired_stderr"] is None and "not a mean over items" in rows["f1"]["note"]
    assert rows["f1"]["delta"] == pytest.approx(0.05)
