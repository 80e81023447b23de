"""Every shift verdict is a change from the unshifted model, with a noise model (issue 51, item 2).

A real Llama read "length partly collapses from ×1 (up to 15% of the rows > 10%)" while its collapse
rate fell with length (0.155 → 0.142): the unshifted level's own collapse was reported as the probe's
effect, and `report A B` then read it as SSA fixing length. Here each level is read against the same
model's unshifted level on the same prompts, a rise counts only beyond the standard error of the
paired per-prompt differences, and a collapse that falls says so.
"""

from __future__ import annotations

import json
import math
import statistics

import numpy as np
import pytest

import ssacli
from ssacli.diagnosis.comparison import comparison_findings
from ssacli.diagnosis.outputs import NOISE_SIGMAS, ROBUST_COLLAPSE, collapse_change
from ssacli.diagnosis.probe_result import ProbeResult
from ssacli.diagnosis.result import DiagnoseResult
from ssacli.diagnosis.verdicts import paired_verdicts, probe_verdicts
from tests.helpers.cli import run_main
from tests.helpers.result_schema import schema_errors

PROMPTS = 8
# prompt-to-prompt spread of the unshifted level: what the shift's change is read against is not this,
# but how each prompt moves (paired)
SPREAD = np.array([0.03, -0.02, 0.01, -0.03, 0.02, 0.0, -0.01, 0.0])
JITTER = np.array([1, -1, 1, -1, -1, 1, -1, 1]) * 1e-3  # how much each prompt's change differs


def _probe(name, levels, prompts, kl=None) -> ProbeResult:
    """``name`` over ``levels`` on 1 layer × 2 heads whose rows collapse at each level as the prompts'
    mean: ``prompts`` [level, prompt] (every prompt the same number of rows); outputs moved by ``kl``."""
    prompts = np.asarray(prompts, dtype=float)
    n = len(levels)
    rates = np.repeat(prompts.mean(axis=1).reshape(n, 1, 1), 2, axis=2)
    metrics = {
        "collapse_rate": rates,
        "max_weight": np.full((n, 1, 2), 0.5),
        "entropy": np.full((n, 1, 2), 0.5),
    }
    extras = {} if kl is None else {"output_kl": list(kl)}
    rms = np.array(levels, dtype=float).reshape(n, 1)  # the shift arrived in full (magnitude probes)
    return ProbeResult(name, [float(v) for v in levels], metrics, np.full((n, 1), 64), extras=extras,
                       layer_metrics={"logit_rms": rms}, prompt_collapse=prompts)  # fmt: skip


def _result(*probes) -> DiagnoseResult:
    return DiagnoseResult("m", "llama", "softmax", "ssacli", ["l0"], [2], list(probes))


def _falling_length() -> ProbeResult:
    """The Llama's length sweep: 0.155 → 0.147 → 0.144 → 0.142, every prompt moving alike."""
    base = 0.155 + SPREAD
    return _probe("length", [1, 2, 4, 8], [base + d + JITTER * (i > 0) for i, d in
                                            enumerate((0.0, -0.008, -0.011, -0.013))])  # fmt: skip


def test_collapse_that_falls_with_length_reads_falls_and_the_baseline_is_its_own_finding():
    probe = _falling_length()
    fresh = probe.fresh_collapse_rate()
    assert fresh[0] > ROBUST_COLLAPSE and np.all(np.diff(fresh) < 0)  # the old rule's "partly collapses"
    result = _result(probe)
    (verdict,) = probe_verdicts(result)
    assert verdict.kind == "collapse falls" and verdict.tone == "unconfirmed"
    assert verdict.line.startswith(
        f"collapse falls with the shift ({100 * fresh[0]:.1f}% at ×1 → {100 * fresh[3]:.1f}% at ×8; "
    )
    texts = [verdict.line, *(f["text"] for f in result.findings())]
    assert not any("partly collapses" in t or "more than 10%" in t for t in texts)
    # the unshifted level's collapse is a finding of its own, not the probe's effect
    (base,) = [f for f in result.findings() if f["kind"] == "baseline_collapse"]
    assert base["value"] == pytest.approx(fresh[0]) and f"{fresh[0]:.1%}" in base["text"]
    assert "before any shift" in base["text"]


def test_a_high_unshifted_collapse_that_does_not_rise_is_not_partly_collapses_from_the_first_level():
    flat = 0.155 + SPREAD
    probe = _probe("embed-scale", [1, 4, 16], [flat, flat + JITTER, flat - JITTER], kl=[0.0, 0.01, 0.02])
    verdict = probe_verdicts([probe])[0]
    assert verdict.kind == "robust" and "partly" not in verdict.line, verdict.line


def test_a_rise_beyond_the_noise_and_the_robust_share_partly_collapses_from_where_it_rises():
    base = 0.155 + SPREAD
    rise = (0.0, 0.03, 0.245)  # σ=4: +3 points (real, but little); σ=16: +24.5 points
    probe = _probe("embed-scale", [1, 4, 16], [base + r + JITTER * (r > 0) for r in rise], kl=[0, 0.01, 0.02])
    verdict = probe_verdicts([probe])[0]
    assert (verdict.kind, verdict.level) == ("partly collapses", 16.0), verdict.line
    change = collapse_change(probe, 2)
    fresh = probe.fresh_collapse_rate()
    assert change.change == pytest.approx(fresh[2] - fresh[0]) and change.prompts == PROMPTS
    assert f"+{100 * change.change:.1f} points over the unshifted {fresh[0]:.0%} at σ=1" in verdict.line
    assert "noise ±" in verdict.line and "not measured" not in verdict.line


@pytest.mark.parametrize("kl", [[0.0, 0.01, 0.02], None])  # robust (outputs held), no collapse (unmeasured)
def test_a_small_rise_beyond_the_noise_is_said_not_hidden(kl):
    """+3 points at σ=16, every prompt rising alike: under the 10-point line, so neither "partly
    collapses" nor hidden as "no collapse"; the line gives the rise and its noise. A flat sweep keeps
    its plain line."""
    base = 0.155 + SPREAD
    risen = _probe("embed-scale", [1, 4, 16], [base, base + JITTER, base + 0.03 + JITTER], kl=kl)
    flat = _probe("embed-scale", [1, 4, 16], [base, base + JITTER, base - JITTER], kl=kl)
    verdict, plain = probe_verdicts([risen])[0], probe_verdicts([flat])[0]
    change = collapse_change(risen, 2)
    assert change.beyond_noise() and 0 < change.change <= ROBUST_COLLAPSE
    assert verdict.kind == plain.kind == ("robust" if kl else "no collapse"), (verdict.line, plain.line)
    said = (
        f"+{100 * change.change:.1f} points over the unshifted {change.before:.0%} at σ=1, under the 10% line"
    )
    assert said in verdict.line and "noise ±" in verdict.line
    assert "points" not in plain.line and ("robust up to" if kl else "no collapse up to") in plain.line
    if kl is None:
        assert not verdict.line.startswith("no collapse")


def test_a_rise_within_the_prompt_to_prompt_noise_is_not_counted():
    """The same +20 points at σ=16, once with every prompt rising alike (counted), once with half the
    prompts rising 40 points and half not at all (the standard error of the paired change, ~0.076,
    puts +20 points within NOISE_SIGMAS of nothing): not counted."""
    base = np.full(PROMPTS, 0.25)
    steady = _probe("embed-scale", [1, 4, 16], [base, base, base + 0.2 + JITTER], kl=[0, 0.01, 0.02])
    swing = np.array([0.4, 0.0] * (PROMPTS // 2))
    noisy = _probe("embed-scale", [1, 4, 16], [base, base, base + swing], kl=[0, 0.01, 0.02])
    assert probe_verdicts([steady])[0].kind == "partly collapses"
    assert probe_verdicts([noisy])[0].kind == "robust"
    change = collapse_change(noisy, 2)
    diffs = list(swing)
    assert change.noise == pytest.approx(statistics.stdev(diffs) / math.sqrt(len(diffs)))
    assert ROBUST_COLLAPSE < change.change < NOISE_SIGMAS * change.noise


def test_a_result_saved_before_the_per_prompt_rates_says_its_noise_was_not_measured():
    probe = _falling_length()
    data = json.loads(_result(probe).to_json())
    assert schema_errors(data) == []
    again = DiagnoseResult.from_dict(data)
    np.testing.assert_allclose(again.probes[0].prompt_collapse, probe.prompt_collapse)
    assert data["probes"][0]["summary"]["collapse_change"]["prompts"] == [PROMPTS] * 4
    del data["probes"][0]["prompt_collapse"]
    old = DiagnoseResult.from_dict(data)
    (verdict,) = probe_verdicts(old)
    assert old.probes[0].prompt_collapse is None and "noise not measured" in verdict.line
    assert verdict.kind == "collapse falls"  # every change counts without a noise estimate


def test_a_comparison_reads_each_models_change_not_its_unshifted_level(tmp_path, monkeypatch, capsys):
    """A: the Llama (falls from a high unshifted level); B: a model that collapses nowhere. The old
    verdicts read "A partly collapses from ×1 … B no collapse up to ×8", as if B fixed length.
    `render A --compare B` prints the comparison `report A B` opens with (render_comparison)."""
    a = _result(_falling_length())
    none = np.zeros((4, PROMPTS))
    b = _result(_probe("length", [1, 2, 4, 8], none))
    ((name, va, vb),) = paired_verdicts(a, b)
    assert (va.kind, vb.kind) == ("collapse falls", "no collapse")
    (tmp_path / "a.json").write_text(a.to_json())
    (tmp_path / "b.json").write_text(b.to_json())
    args = ["render", str(tmp_path / "a.json"), "--compare", str(tmp_path / "b.json")]
    code, out, err = run_main(args, monkeypatch, capsys)
    assert code == 0, err
    text = " ".join(out.split())
    assert "collapse falls with the shift" in text and "partly collapses" not in text
    # the shift did about the same to both (−1.3 points, 0): no change of the shift's effect to report
    assert not any(f["kind"] == "shift_change" for f in comparison_findings(a, b))
    # a probe that raises A's collapse by 24.5 points and B's by none: the changes are compared
    base = 0.155 + SPREAD
    rising = _probe("embed-scale", [1, 4, 16], [base, base + JITTER, base + 0.245 - JITTER], kl=[0, 0, 0])
    flat = _probe("embed-scale", [1, 4, 16], [base, base + JITTER, base - JITTER], kl=[0, 0, 0])
    (found,) = [f for f in comparison_findings(_result(rising), _result(flat)) if f["kind"] == "shift_change"]
    assert found["a"] == pytest.approx(0.245) and found["b"] == pytest.approx(0.0, abs=1e-12)
    assert "+24.5 points from the unshifted σ=1 in A → +0.0 in B" in found["text"]


def test_diagnose_keeps_each_prompts_collapse_paired_across_lengths():
    """A real run (the bundled LM, its text): the length probe's ×2 inputs hold two base-length
    windows of the text each, cut there so that window j is the same tokens as prompt j at ×1; under
    a causal model the first window of each ×2 input sees exactly what that prompt saw at ×1, so its
    collapse is the same. Other probes keep one prompt per sample, however long it is (numeric's
    6-digit prompts run past the base length). The saved result keeps them, within the schema."""
    result = ssacli.diagnose("builtin:wikitext-softmax", ["length:1,2", "numeric:2,6"], samples=4, length=16)
    numeric = result.probe("numeric")
    assert numeric.rows.max() > 4 * 16  # past the base length: one prompt each all the same
    assert numeric.prompt_collapse.shape == (2, 4) and np.isfinite(numeric.prompt_collapse).all()
    probe = result.probe("length")
    prompts = probe.prompt_collapse
    assert prompts.shape == (2, 4) and np.isfinite(prompts).all()
    np.testing.assert_allclose(prompts[1, ::2], prompts[0, ::2], rtol=1e-6, atol=1e-9)
    assert not np.allclose(prompts[1, 1::2], prompts[0, 1::2])  # the second window saw more context
    # at ×1 every prompt counts the same rows, so their mean is the pooled rate
    assert prompts[0].mean() == pytest.approx(probe.fresh_collapse_rate()[0], rel=1e-9)
    data = json.loads(result.to_json())
    assert data["probes"][0]["prompt_collapse"] == prompts.tolist() and schema_errors(data) == []
