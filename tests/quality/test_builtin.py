"""`ssacli report` measures quality on language models without any data option: perplexity on the
built-in texts and accuracy on the built-in minimal pairs (ssacli.quality.builtin).

References are computed here from each model's own forward, one window or one sentence at a time,
with plain torch: the perplexity is exp of the mean next-token NLL over the built-in texts (the
diagnose texts joined by blank lines) cut into windows of the model's 128 positions, BOS first; a
pair is right when the good sentence's summed token log-prob after BOS is higher.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch.nn import functional as F
from typer.testing import CliRunner

from ssacli.cli import app
from ssacli.diagnosis.texts import TEXTS
from ssacli.models.loading import load_model
from ssacli.quality.builtin import BUILTIN_PAIRS

runner = CliRunner()
MODELS = {"before": "builtin:wikitext-softmax", "after": "builtin:wikitext-ssa"}


def reference_perplexity(loaded, text: str, window: int) -> float:
    tokenizer, bos = loaded.tokenizer, loaded.tokenizer.bos_token_id
    ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    total, count = 0.0, 0
    for start in range(0, len(ids), window - 1):  # window - 1 text tokens after BOS
        row = torch.tensor([[bos, *ids[start : start + window - 1]]])
        with torch.no_grad():
            logits = loaded.model(row).logits[0, :-1].double()
        total += float(F.cross_entropy(logits, row[0, 1:], reduction="sum"))
        count += row.shape[1] - 1
    return math.exp(total / count)


def reference_log_prob(loaded, sentence: str) -> float:
    ids = [loaded.tokenizer.bos_token_id, *loaded.tokenizer(sentence, add_special_tokens=False)["input_ids"]]
    row = torch.tensor([ids])
    with torch.no_grad():
        logprobs = F.log_softmax(loaded.model(row).logits[0].double(), -1)
    return float(sum(logprobs[i - 1, ids[i]] for i in range(1, len(ids))))


def test_report_on_two_lms_measures_perplexity_and_minimal_pairs_without_data(tmp_path):
    out = tmp_path / "r.json"
    args = ["report", MODELS["before"], MODELS["after"], "--samples", "2", "--probe", "outlier:1"]
    result = runner.invoke(app, [*args, "--device", "cpu", "--json", str(out)], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "built-in texts: perplexity" in result.output
    assert "minimal pairs (built-in): accuracy" in result.output
    assert "no quality measures" not in result.output
    data = json.loads(out.read_text())
    assert data["settings"]["builtin"] == {"texts": "builtin:texts", "pairs": "builtin:agreement"}
    rows = {r["key"]: r for r in data["quality"]}
    text = "\n\n".join(TEXTS)
    for side, ref in MODELS.items():
        loaded = load_model(ref, device="cpu")
        assert loaded.max_positions == 128  # the window the report uses (its --seq-len 128, capped)
        expected = reference_perplexity(loaded, text, 128)
        assert data["measurements"][side]["lm_builtin"]["perplexity"] == pytest.approx(expected, rel=1e-5)
        assert rows["lm_builtin.ppl"][side] == pytest.approx(expected, rel=1e-5)
        assert 1 < expected < loaded.tokenizer.vocab_size  # better than uniform, not perfect
        pairs = data["measurements"][side]["pairs"]
        correct = {}
        for name, records in BUILTIN_PAIRS.items():
            scores = [
                (
                    reference_log_prob(loaded, r["sentence_good"]),
                    reference_log_prob(loaded, r["sentence_bad"]),
                )
                for r in records
            ]
            correct[name] = sum(good > bad for good, bad in scores)
            assert pairs["files"][name]["correct"] == correct[name], (side, name)
        assert pairs["pairs"] == 40 and pairs["source"] == "builtin:agreement"
        assert rows["pairs.accuracy"][side] == pytest.approx(sum(correct.values()) / 40)


def test_user_data_replaces_the_builtin_measure_it_stands_for(tmp_path):
    (tmp_path / "id.txt").write_text(TEXTS[0])
    out = tmp_path / "r.json"
    args = ["report", MODELS["before"], MODELS["before"], "--samples", "1", "--probe", "outlier:1"]
    result = runner.invoke(app, [*args, "--text-id", str(tmp_path / "id.txt"), "--quiet", "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    keys = {r["key"] for r in data["quality"]}
    assert "lm_id.ppl" in keys and "lm_builtin.ppl" not in keys  # the user's text, not the built-in
    assert "pairs.accuracy" in keys and data["settings"]["builtin"] == {"pairs": "builtin:agreement"}
    result = runner.invoke(app, [*args, "--no-builtin"], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "no quality measures: --no-builtin" in result.output
