"""`ssacli check`: the requirement grammar, evaluation on hand-made results, baselines, ssacli.toml,
JUnit/JSON outputs, exit codes, and the CI recipes of docs/ci.md run for real."""

from __future__ import annotations

import json
import math
import re
import shlex
import shutil
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import typer
import yaml
from transformers import AutoConfig, AutoModelForCausalLM
from typer.testing import CliRunner

import ssacli
from ssacli.check.config import init_config, load_config
from ssacli.check.requirements import load_baseline, parse_requirement, required_probes, run_check
from ssacli.cli import app
from ssacli.diagnosis import run as diagnosis
from ssacli.diagnosis.probe_result import ProbeResult
from ssacli.diagnosis.result import DiagnoseResult
from ssacli.errors import InputError, UnsupportedModelError, UsageError
from ssacli.models.builtins import BUILTIN_DIR

DOCS = Path(__file__).resolve().parents[2] / "docs" / "ci.md"
runner = CliRunner()
NAN = math.nan
# [layer][head] at the harsh level of each synthetic probe; 3 layers x 2 heads, one undefined head.
COLLAPSE_100 = [[0.1, 0.3], [0.05, NAN], [0.6, 0.2]]
ENTROPY_16 = [[0.9, 0.8], [0.7, 0.4], [0.95, 0.5]]


def _grid(value: float) -> list[list[float]]:
    return [[value, value] for _ in range(3)]


def make_result(collapse_100=COLLAPSE_100, entropy_16=ENTROPY_16, seed: int = 0) -> DiagnoseResult:
    """outlier at σ = 1, 100; embed-scale at σ = 1, 16; numeric skipped; everything else flat."""

    def probe(name, levels, harsh):
        flat = {"collapse_rate": 0.0, "max_weight": 0.2, "entropy": 0.95, "row_mass": 1.0}
        metrics = {k: np.array([_grid(v), harsh.get(k, _grid(v))], dtype=float) for k, v in flat.items()}
        if name == "outlier":
            metrics["outlier_capture"] = np.array([_grid(0.01), _grid(0.4)])
        return ProbeResult(name, levels, metrics, rows=np.full((2, 3), 10))

    undefined = {k: np.full((1, 3, 2), NAN) for k in ("collapse_rate", "max_weight", "entropy")}
    skipped = ProbeResult("numeric", [3.0], undefined, np.zeros((1, 3)), note="no tok")
    probes = [
        probe("outlier", [1.0, 100.0], {"collapse_rate": collapse_100}),
        probe("embed-scale", [1.0, 16.0], {"entropy": entropy_16}),
        skipped,
    ]
    return DiagnoseResult(
        "synthetic", "icl-gpt2", "softmax", "ssacli", ["l0", "l1", "l2"], [2, 2, 2], probes,
        settings={"seed": seed, "samples": 8},
    )  # fmt: skip


def picked(grid, layers=range(3), heads=range(2)) -> list[float]:
    """The finite values of a [layer][head] grid in the selection (the test's own reference)."""
    return [grid[layer][head] for layer in layers for head in heads if not math.isnan(grid[layer][head])]


# ---- grammar ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, fields",
    [
        ("collapse_rate@outlier:100 <= 0.2", dict(metric="collapse_rate", probe="outlier", level=100.0,
                                                  aggregate="mean", op="<=", value=0.2, layers=None)),
        ("  entropy@embed-scale:16 >= 3e-1 ", dict(probe="embed-scale", level=16.0, op=">=", value=0.3)),
        ("collapse_rate@outlier:100[layer=0-1] max<=0.2", dict(aggregate="max", layers=(0, 1), heads=None)),
        ("entropy@embed-scale:16[head=1, layer=2] min > -1", dict(layers=(2, 2), heads=(1, 1), value=-1.0)),
        ("max_weight@dominant-key:0 == 0.5", dict(probe="dominant-key", level=0.0, op="==")),
        ("outlier_capture@dominant-key:32 < 1", dict(metric="outlier_capture", op="<")),
        ("entropy@length:4 mean >= 0.1", dict(probe="length", level=4.0, aggregate="mean")),
    ],
)  # fmt: skip
def test_valid_requirements_parse(text, fields):
    req = parse_requirement(text)
    assert req.text == text.strip()
    for key, value in fields.items():
        assert getattr(req, key) == value, key


@pytest.mark.badinput
@pytest.mark.parametrize(
    "text, words",
    [
        ("", "empty"),
        ("entropy@embed-scale:16 0.3", "no comparison"),
        ("entropy@embed-scale:16 = 0.3", "use =="),
        ("entropy@embed-scale:16 =< 0.3", "use <="),
        ("0.1 < entropy@embed-scale:16 < 0.3", "more than one"),
        ("entropy@embed-scale:16 >= high", "not a number"),
        ("entropy@embed-scale:16 >= inf", "finite"),
        ("entropy@embed-scale:16 >=", "no threshold"),
        ("entropy >= 0.3", "name the probe"),
        ("entropi@embed-scale:16 >= 0.3", "collapse_rate, effective_tokens"),
        ("entropy@embed:16 >= 0.3", "embed-scale, outlier, key-scale, logit-scale"),
        ("entropy@embed-scale >= 0.3", "default levels: 1,2,4,8,16,32"),
        ("entropy@embed-scale:4,16 >= 0.3", "one level"),
        ("entropy@numeric:2.5 >= 0.3", "whole number"),
        ("entropy@outlier:0 >= 0.3", "> 0"),
        ("entropy@embed-scale:16 median >= 0.3", "mean, max, min"),
        ("entropy@embed-scale:16[row=1] >= 0.3", "layer=N"),
        ("entropy@embed-scale:16[layer=3-1] >= 0.3", "empty"),
        ("entropy@embed-scale:16[layer=a] >= 0.3", "range A-B"),
        ("entropy@embed-scale:16[layer=1,layer=2] >= 0.3", "twice"),
        ("outlier_capture@embed-scale:16 <= 0.3", "outlier, key-scale, dominant-key"),
    ],
)
def test_bad_requirements_name_the_expression_the_problem_and_an_example(text, words):
    with pytest.raises(UsageError) as info:
        parse_requirement(text)
    message = str(info.value)
    assert repr(text.strip()) in message and words in message and "e.g." in message


def test_required_probes_are_the_minimal_set():
    texts = ["entropy@outlier:100 >= 0", "max_weight@embed-scale:2 <= 1", "collapse_rate@outlier:10 max <= 1",
             "entropy@outlier:100 min >= 0"]  # fmt: skip
    reqs = [parse_requirement(t) for t in texts]
    assert required_probes(reqs) == ["embed-scale:2", "outlier:10,100"]


# ---- evaluation ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "selector, aggregate, layers, heads",
    [
        ("", "mean", range(3), range(2)),
        ("", "max", range(3), range(2)),
        ("", "min", range(3), range(2)),
        ("[layer=0-1]", "mean", range(0, 2), range(2)),
        ("[layer=0-1]", "max", range(0, 2), range(2)),
        ("[head=1]", "max", range(3), range(1, 2)),
        ("[head=0]", "mean", range(3), range(0, 1)),
        ("[layer=2,head=0]", "mean", range(2, 3), range(0, 1)),
    ],
)
def test_measure_aggregates_the_selected_heads(selector, aggregate, layers, heads):
    values = picked(COLLAPSE_100, layers, heads)
    expected = {"mean": sum(values) / len(values), "max": max(values), "min": min(values)}[aggregate]
    req = parse_requirement(f"collapse_rate@outlier:100{selector} {aggregate} <= 1")
    assert req.measure(make_result()) == pytest.approx(expected, abs=1e-12)


def test_default_mean_is_the_diagnose_model_mean():
    result = make_result()
    mean = parse_requirement("entropy@embed-scale:16 >= 0").measure(result)
    assert mean == pytest.approx(result.probe("embed-scale").model_mean("entropy")[1])
    assert mean == pytest.approx(sum(picked(ENTROPY_16)) / 6)


def test_thresholds_pass_and_fail_at_the_boundary():
    peak = max(picked(COLLAPSE_100))
    result = make_result()
    cases = [(f"<= {peak}", True), (f"< {peak}", False), (f">= {peak}", True), (f"> {peak}", False),
             (f"== {peak}", True), (f"<= {peak - 0.01}", False)]  # fmt: skip
    for tail, passes in cases:
        outcome = parse_requirement(f"collapse_rate@outlier:100 max {tail}").evaluate(result)
        assert outcome.passed is passes, tail
        assert outcome.measured == pytest.approx(peak)
        assert f"{peak:.4g}" in outcome.message


def test_undefined_values_fail_with_the_reason():
    result = make_result()
    outcome = parse_requirement("entropy@numeric:3 >= 0").evaluate(result)
    assert not outcome.passed and math.isnan(outcome.measured) and "no tok" in outcome.message
    # Layer 1 head 1 is undefined: selecting only it leaves nothing to measure.
    outcome = parse_requirement("collapse_rate@outlier:100[layer=1,head=1] <= 1").evaluate(result)
    assert not outcome.passed and "undefined" in outcome.message


def test_requirements_that_do_not_fit_the_run_are_usage_errors():
    result = make_result()
    for text, words in (("collapse_rate@outlier:10 <= 1", "have 1, 100"),
                        ("collapse_rate@outlier:100[layer=3] <= 1", "out of range"),
                        ("entropy@logit-scale:8 >= 0", "no probe")):  # fmt: skip
        with pytest.raises(UsageError, match=words):
            parse_requirement(text).evaluate(result)


# ---- baselines ---------------------------------------------------------------------------------------


def _shifted(grid, delta):
    return [[v + delta for v in row] for row in grid]


@pytest.mark.parametrize(
    "expr, kwargs, passes",
    [
        # collapse_rate saturates upwards: a rise beyond max_regression fails, a fall never does.
        ("collapse_rate@outlier:100 <= 1", dict(collapse_100=_shifted(COLLAPSE_100, 0.1)), False),
        ("collapse_rate@outlier:100 <= 1", dict(collapse_100=_shifted(COLLAPSE_100, 0.04)), True),
        ("collapse_rate@outlier:100 <= 1", dict(collapse_100=_shifted(COLLAPSE_100, -0.05)), True),
        # entropy saturates downwards.
        ("entropy@embed-scale:16 min >= 0", dict(entropy_16=_shifted(ENTROPY_16, -0.1)), False),
        ("entropy@embed-scale:16 min >= 0", dict(entropy_16=_shifted(ENTROPY_16, 0.3)), True),
        # row_mass has no saturating direction: never a regression.
        ("row_mass@outlier:100 >= 0", dict(collapse_100=_shifted(COLLAPSE_100, 0.5)), True),
    ],
)
def test_regression_is_measured_in_the_saturating_direction(expr, kwargs, passes):
    req, before, after = parse_requirement(expr), make_result(), make_result(**kwargs)
    outcome = req.evaluate(after, before, max_regression=0.05)
    assert outcome.passed is passes, outcome.message
    assert outcome.baseline == pytest.approx(req.measure(before))
    assert req.evaluate(after, before).passed  # without max_regression the baseline is only shown
    if not passes:
        assert "regressed" in outcome.message


def test_baseline_without_the_level_is_not_compared():
    before = make_result()
    before.probes = before.probes[1:]  # no outlier probe
    outcome = parse_requirement("collapse_rate@outlier:100 <= 1").evaluate(make_result(), before, 0.0)
    assert outcome.passed and outcome.baseline is None and "not compared" in outcome.message


def test_baselines_load_from_diagnose_and_check_json(tmp_path, monkeypatch):
    result = make_result()
    (tmp_path / "d.json").write_text(result.to_json())
    monkeypatch.setattr(diagnosis, "diagnose", lambda *a, **k: make_result(seed=1))
    report = run_check("synthetic", ["collapse_rate@outlier:100 max <= 1"], baseline=tmp_path / "d.json")
    (tmp_path / "c.json").write_text(json.dumps(report.to_dict()))
    for name in ("d.json", "c.json"):
        loaded = load_baseline(tmp_path / name)
        np.testing.assert_array_equal(loaded.probe("outlier").metrics["collapse_rate"],
                                      result.probe("outlier").metrics["collapse_rate"])  # fmt: skip
    assert any("seed=0" in w and "seed=1" in w for w in report.warnings)
    (tmp_path / "bad.json").write_text('{"schema": "something-else"}')
    for name in ("bad.json", "missing.json"):
        with pytest.raises(InputError):
            load_baseline(tmp_path / name)


# ---- ssacli.toml ---------------------------------------------------------------------------------


def test_config_is_validated_and_paths_are_relative_to_it(tmp_path):
    sub = tmp_path / "conf"
    sub.mkdir()
    (sub / "ssacli.toml").write_text(
        '[check]\nmodel = "builtin:every-ssa"\nrequires = ["entropy@outlier:1 >= 0"]\n'
        'baseline = "base.json"\nmax_regression = 0\nsamples = 3\ntau = 1\n'
    )
    config = load_config(sub / "ssacli.toml")
    assert config["baseline"] == str(sub / "base.json") and config["model"] == "builtin:every-ssa"
    assert config["samples"] == 3 and config["max_regression"] == 0
    bad = [
        ("[check]\nsampels = 3\n", "unknown key 'sampels'"),
        ('[check]\nsamples = "3"\n', "int"),
        ("[check]\nrequires = [1]\n", "list of strings"),
        ("[check\n", "not valid TOML"),
    ]
    for body, words in bad:
        (tmp_path / "bad.toml").write_text(body)
        with pytest.raises(UsageError, match=words):
            load_config(tmp_path / "bad.toml")


def test_flags_override_the_config(tmp_path, monkeypatch):
    calls = []

    def fake(model, probes, **kwargs):
        calls.append((model, probes, kwargs))
        return make_result()

    monkeypatch.setattr(diagnosis, "diagnose", fake)
    monkeypatch.chdir(tmp_path)
    Path("ssacli.toml").write_text('[check]\nmodel = "builtin:every-ssa"\nsamples = 3\nseed = 7\n'
                                   'requires = ["collapse_rate@outlier:100 max <= 0.01"]\n')  # fmt: skip
    assert runner.invoke(app, ["check", "--quiet"]).exit_code == 1  # the config's requirement: 0.6 > 0.01
    assert calls[-1] == ("builtin:every-ssa", ["outlier:100"], dict(samples=3, seed=7))
    # the file is for builtin:every-ssa: it applies to "other" only when named with --config
    # a model folder here, whole as far as its headers go (the fake diagnose never loads it), not a Hub id
    shutil.copytree(BUILTIN_DIR / "every-ssa", "other")
    args = ["check", "other", "--config", "ssacli.toml", "--samples", "2", "--quiet"]
    args += ["-r", "entropy@embed-scale:16 min >= 0.3"]
    assert runner.invoke(app, args).exit_code == 0  # 0.4 >= 0.3; the config's list is replaced
    assert calls[-1] == ("other", ["embed-scale:16"], dict(samples=2, seed=7))


def test_init_writes_a_config_that_every_softmax_passes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["check", "--init"])
    assert result.exit_code == 0, result.output
    text = Path("ssacli.toml").read_text()
    config = tomllib.loads(text)["check"]
    assert config["model"] == "builtin:every-softmax" and len(config["requires"]) >= 3
    for expr in config["requires"]:
        parse_requirement(expr)
    again = runner.invoke(app, ["check", "--init"])
    assert (
        again.exit_code == 2 and "already exists" in again.stderr and Path("ssacli.toml").read_text() == text
    )
    run = runner.invoke(app, ["check", "--json", "check.json"])
    assert run.exit_code == 0, run.output
    data = json.loads(Path("check.json").read_text())
    assert data["passed"] and [r["expr"] for r in data["requirements"]] == config["requires"]
    expected: dict[str, set] = {}
    for req in map(parse_requirement, config["requires"]):
        expected.setdefault(req.probe, set()).add(req.level)
    assert {p["name"]: p["levels"] for p in data["result"]["probes"]} == {
        k: sorted(v) for k, v in expected.items()
    }  # only the probe levels the requirements name were run


def test_language_model_defaults_parse_and_are_measurable(tmp_path):
    for family in ("causal", "llama", "bert", "seq2seq"):
        config = tomllib.loads(init_config(family, "x"))["check"]
        assert all(parse_requirement(e) for e in config["requires"])
    config = AutoConfig.for_model("gpt2", vocab_size=64, n_embd=16, n_layer=1, n_head=2, n_positions=64)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "gpt2")
    assert ssacli.load_model(str(tmp_path / "gpt2")).kind == "causal"  # the template check --init picks
    requires = tomllib.loads(init_config("causal", "x"))["check"]["requires"]
    report = run_check(str(tmp_path / "gpt2"), requires, samples=2, length=16, random_ids=True)
    assert all(math.isfinite(o.measured) for o in report.outcomes)


# ---- outputs and exit codes ---------------------------------------------------------------------------

PASSING = "entropy@embed-scale:32 >= 0.5"
FAILING = "collapse_rate@dominant-key:32 <= 0.5"  # softmax collapses onto a dominant key (Theorem 2)


def test_junit_and_json_report_each_requirement(tmp_path):
    args = ["check", "builtin:every-softmax", "-r", PASSING, "-r", FAILING, "--quiet",
            "--junit", str(tmp_path / "j.xml"), "--json", str(tmp_path / "c.json")]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    suite = ET.parse(tmp_path / "j.xml").getroot()
    cases = suite.findall("testcase")
    assert suite.tag == "testsuite" and suite.get("name") == "ssacli check"
    assert [c.get("name") for c in cases] == [PASSING, FAILING] and suite.get("failures") == "1"
    assert {c.get("classname") for c in cases} == {"builtin:every-softmax"}
    assert cases[0].find("failure") is None and cases[1].find("failure") is not None
    # The measured value, checked against an independent diagnose run with the same settings.
    rates = ssacli.diagnose("builtin:every-softmax", ["dominant-key:32"]).probe("dominant-key")
    expected = float(np.nanmean(rates.metrics["collapse_rate"][0]))
    shown = float(re.search(r"measured ([-\d.e+]+)", cases[1].find("failure").get("message")).group(1))
    assert shown == pytest.approx(expected, rel=1e-3) and expected > 0.5
    assert "measured=" in cases[1].find("system-out").text
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["schema"] == "ssacli-check" and data["passed"] is False
    assert [r["passed"] for r in data["requirements"]] == [True, False]
    assert data["requirements"][1]["measured"] == pytest.approx(expected)
    assert DiagnoseResult.from_dict(data["result"]).probe("dominant-key").levels == [32.0]


def _one_line_error(result, code, words):
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == code, result.output
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in result.output, result.output


@pytest.mark.badinput
def test_usage_and_input_errors_exit_2_without_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ssacli.toml here
    out = tmp_path / "c.json"
    ok = ["-r", PASSING, "--json", str(out)]
    cases = [
        (["-r", "entropy@embed-scale:32 = 0.5", "--json", str(out)], "use =="),
        (["--config", str(tmp_path / "none.toml"), "--json", str(out)], "does not exist"),
        ([str(tmp_path / "no-model"), *ok], "does not exist"),
        ([*ok, "--baseline", str(tmp_path / "none.json")], "does not exist"),
        ([*ok, "--max-regression", "0.1"], "--baseline"),
        (["-r", "entropy@embed-scale:32[layer=9] >= 0", "--json", str(out)], "out of range"),
        (["--json", str(out)], "no requirements"),
    ]
    for args, words in cases:
        _one_line_error(runner.invoke(app, ["check", *args, "--quiet"]), 2, words)
        assert not out.exists() and not list(tmp_path.glob(".c.json*")), args


@pytest.mark.badinput
def test_models_that_cannot_be_checked_exit_3(tmp_path, monkeypatch):
    config = AutoConfig.for_model("gpt_neo", vocab_size=64, num_layers=1, attention_types=[[["global"], 1]],
                                  hidden_size=16, num_heads=2, max_position_embeddings=32)  # fmt: skip
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "neo")
    args = [
        "check",
        str(tmp_path / "neo"),
        "--scorer",
        "ssa",
        "-r",
        PASSING,
        "--json",
        str(tmp_path / "c.json"),
    ]
    _one_line_error(runner.invoke(app, args), 3, "gpt_neo")
    for error in (UnsupportedModelError("no route"), RuntimeError("boom")):

        def broken(*args, error=error, **kwargs):
            raise error

        monkeypatch.setattr(diagnosis, "diagnose", broken)
        _one_line_error(runner.invoke(app, ["check", "-r", PASSING]), 3, str(error))
    assert not (tmp_path / "c.json").exists()


# ---- docs/ci.md -----------------------------------------------------------------------------------


def _yaml_blocks() -> list:
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", DOCS.read_text(), flags=re.S)]


def _ssacli_commands(text: str, env: dict) -> list[list[str]]:
    commands = []
    for line in text.splitlines():
        words = shlex.split(line.split(" #")[0])
        if words and words[0] == "ssacli":
            commands.append([env.get(w[1:], w) if w.startswith("$") else w for w in words[1:]])
    return commands


def test_workflow_in_the_docs_is_complete_and_uses_real_options():
    workflow = next(b for b in _yaml_blocks() if "jobs" in b)
    job = next(iter(workflow["jobs"].values()))
    steps = job["steps"]
    uses = [s.get("uses", "").split("@")[0] for s in steps]
    assert {"actions/checkout", "actions/setup-python", "actions/upload-artifact"} <= set(uses)
    assert next(s for s in steps if "setup-python" in s.get("uses", ""))["with"]["python-version"] == "3.11"
    runs = "\n".join(s.get("run", "") for s in steps)
    assert "pip install torch" in runs and "download.pytorch.org/whl/cpu" in runs
    assert next(s for s in steps if "upload-artifact" in s.get("uses", ""))["if"] == "always()"
    commands = _ssacli_commands(runs, job["env"])
    hook = next(b for b in _yaml_blocks() if "repos" in b)["repos"][0]["hooks"][0]
    commands += _ssacli_commands(hook["entry"], {})
    group = typer.main.get_command(app)
    for words in commands:
        command = group.commands[words[0]]  # KeyError: the docs call a command that does not exist
        options = {o for p in command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")}
        used = {w.split("=")[0] for w in words[1:] if w.startswith("-")}
        assert used <= options, (words[0], used - options)
    names = [w[0] for w in commands]
    assert {"check", "diagnose"} <= set(names)
    check = next(w for w in commands if w[0] == "check")
    assert "--junit" in check and "--json" in check
    assert "--html" in next(w for w in commands if w[0] == "diagnose")


def test_ci_dry_run_of_the_documented_check_step(tmp_path, monkeypatch):
    job = next(iter(next(b for b in _yaml_blocks() if "jobs" in b)["jobs"].values()))
    runs = "\n".join(s.get("run", "") for s in job["steps"])
    check = next(w for w in _ssacli_commands(runs, job["env"]) if w[0] == "check")
    assert job["env"]["MODEL"] == "builtin:every-softmax"
    monkeypatch.chdir(tmp_path)
    for requires, code, failures in (([PASSING], 0, "0"), ([PASSING, FAILING], 1, "1")):
        Path("ssacli.toml").write_text(f"[check]\nrequires = {json.dumps(requires)}\n")
        result = runner.invoke(app, check)
        assert result.exit_code == code, result.output
        suite = ET.parse("junit.xml").getroot()
        assert suite.get("tests") == str(len(requires)) and suite.get("failures") == failures
        assert json.loads(Path("check.json").read_text())["passed"] is (code == 0)


def test_a_config_for_another_model_is_refused_unless_given_explicitly(tmp_path, monkeypatch):
    """Thresholds measured on one model must not silently gate another: an implicit ./ssacli.toml
    whose model differs refuses (exit 2) naming both and the fix; --config FILE applies it anyway."""
    calls = []
    fake = lambda model, probes, **kw: calls.append(model) or make_result()  # noqa: E731
    monkeypatch.setattr(diagnosis, "diagnose", fake)
    monkeypatch.chdir(tmp_path)
    shutil.copytree(BUILTIN_DIR / "every-ssa", tmp_path / "mine")  # whole as far as its headers go
    Path("ssacli.toml").write_text('[check]\nmodel = "mine"\nrequires = ["entropy@embed-scale:16 >= 0"]\n')
    refused = runner.invoke(app, ["check", "builtin:every-ssa", "--quiet"])
    assert refused.exit_code == 2 and not calls, refused.output
    line = " ".join(refused.stderr.split())
    assert "'mine'" in line and "'builtin:every-ssa'" in line and "--config ssacli.toml" in line
    assert "--init" in line and "Traceback" not in refused.output
    # --require does not lift the refusal: the file's baseline and probe settings would still apply
    required = ["check", "builtin:every-ssa", "--require", "entropy@embed-scale:16 >= 0", "--quiet"]
    assert runner.invoke(app, required).exit_code == 2 and not calls
    explicit = runner.invoke(app, ["check", "builtin:every-ssa", "--config", "ssacli.toml", "--quiet"])
    assert explicit.exit_code == 0 and calls == ["builtin:every-ssa"], explicit.output
    for same in ("mine", "./mine/", str(tmp_path / "mine")):  # one folder, however it is written
        assert runner.invoke(app, ["check", same, "--quiet"]).exit_code == 0
    assert runner.invoke(app, ["check", "--quiet"]).exit_code == 0 and calls[-1] == "mine"
