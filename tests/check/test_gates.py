"""What `ssacli check --init`'s default gates catch, on the bundled language model: harmless changes
pass (another prompt seed, bfloat16, a less saturated model at equal quality: its own SSA conversion
and the SSA model trained beside it), graded damage fails on the gate meant for it (ssacli.testing.damage:
a temperature on every head, heads made uniform, a broken LM head). The forced-AVX2 build is
tests/kernels/test_native_portable.py's row; docs/ci.md "What the default gates catch" is the table
(scripts/gate_table.py), on SmolLM2-135M too."""

from __future__ import annotations

import copy
import tomllib

import pytest

import ssacli
from ssacli.check.config import load_config
from ssacli.testing.damage import break_lm_head, temper, uniform_heads

MODEL = "builtin:wikitext-softmax"


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """(the ssacli.toml text, its requirements) that `check --init` writes for the bundled LM."""
    path = tmp_path_factory.mktemp("gates") / "ssacli.toml"
    ssacli.write_check_config(MODEL, path)
    return path.read_text(), load_config(path)["requires"]


@pytest.fixture(scope="module")
def model():
    return ssacli.load_model(MODEL)


@pytest.fixture(scope="module")
def healthy(written, model):
    """The undamaged model's check: its outcomes, by requirement."""
    return _check(written, model)[1]


def _check(written, model, **options):
    report = ssacli.run_check(model, written[1], **options)
    return report, {r.text: o for r, o in zip(report.requirements, report.outcomes)}


def _gate(outcomes, prefix: str, aggregate: str = ""):
    """The one outcome whose requirement starts with ``prefix`` (``aggregate``: " max" for the head gate)."""
    found = [
        (t, o) for t, o in outcomes.items() if t.startswith(prefix) and (" max " in t) == bool(aggregate)
    ]
    assert len(found) == 1, (prefix, list(outcomes))
    return found[0][1]


def test_init_gates_quality_and_outputs_and_leaves_saturation_opt_in(written, healthy):
    text, requires = written
    active = {r.split("@")[0] + (" max" if " max " in r else "") for r in requires}
    assert active == {"loss", "entropy", "entropy max", "output_kl"}, requires
    commented = [line.strip() for line in text.splitlines() if line.strip().startswith('# "')]
    assert any(line.startswith('# "collapse_rate@') for line in commented), text  # opt-in, measured
    for line in commented:  # each opt-in line parses once uncommented
        assert tomllib.loads(f"x = [{line[2:]}]")["x"]
    # The entropy gates are anchored at uniform: their limits lie far above the model's own values.
    for aggregate in ("", " max"):
        gate = next(r for r in requires if r.startswith("entropy@") and (" max " in r) == bool(aggregate))
        measured = _gate(healthy, "entropy@", aggregate).measured
        assert float(gate.split("<=")[1]) > measured + 0.5 * (1 - measured), gate


@pytest.mark.parametrize(
    "change",
    [
        "another prompt seed",
        "bfloat16",
        "its faithful SSA conversion",
        "its SSA conversion at the paper's init (spreads attention)",
        "the SSA model trained beside it",
    ],
)
def test_harmless_changes_pass(written, model, change):
    if change == "another prompt seed":
        report, _ = _check(written, MODEL, seed=7)
    elif change == "bfloat16":
        report, _ = _check(written, MODEL, dtype="bfloat16")
    elif change.startswith("its"):  # softmax within 1e-3 nats/token; or b = 0.8, n = 1.5, KL ~0.1
        spec = "ssa:init=faithful" if "faithful" in change else "ssa"
        converted, _ = ssacli.convert(copy.deepcopy(model), spec)
        report, _ = _check(written, converted)
    else:
        report, _ = _check(written, "builtin:wikitext-ssa")
    failed = [f"{r.text}: {o.message}" for r, o in zip(report.requirements, report.outcomes) if not o.passed]
    assert report.passed, failed


def test_a_temperature_on_every_head_is_graded_and_the_harsh_one_fails(written, model, healthy):
    """Entropy rises with the temperature (1 < 1.5 < 3) on both gates, and t = 3 fails them."""
    means, most = [_gate(healthy, "entropy@").measured], [_gate(healthy, "entropy@", " max").measured]
    for t in (1.5, 3.0):
        damaged = copy.deepcopy(model)
        temper(damaged.model, t)
        report, outcomes = _check(written, damaged)
        means.append(_gate(outcomes, "entropy@").measured)
        most.append(_gate(outcomes, "entropy@", " max").measured)
    assert means == sorted(means) and most == sorted(most) and means[0] < means[1] < means[2]
    assert not report.passed and not _gate(outcomes, "entropy@", " max").passed


def test_half_the_heads_uniform_fails_the_head_gate(written, model):
    damaged = copy.deepcopy(model)
    uniform_heads(damaged.model, 0.5)
    report, outcomes = _check(written, damaged)
    head = _gate(outcomes, "entropy@", " max")
    assert not head.passed and head.measured == pytest.approx(1.0, rel=1e-4)  # a zeroed query: uniform


def test_uniform_attention_fails_both_attention_gates(written, model):
    damaged = copy.deepcopy(model)
    uniform_heads(damaged.model, 1.0)
    report, outcomes = _check(written, damaged)
    for gate in (_gate(outcomes, "entropy@"), _gate(outcomes, "entropy@", " max")):
        assert not gate.passed and gate.measured == pytest.approx(1.0, rel=1e-4)


def test_a_broken_lm_head_fails_the_loss_gate_and_leaves_attention_alone(written, model, healthy):
    before = healthy
    damaged = copy.deepcopy(model)
    break_lm_head(damaged.model)
    report, after = _check(written, damaged)
    assert not _gate(after, "loss@").passed and _gate(before, "loss@").passed
    # Attention is untouched: the same entropy as the healthy model's, to float rounding.
    assert _gate(after, "entropy@").measured == pytest.approx(_gate(before, "entropy@").measured, rel=1e-5)
