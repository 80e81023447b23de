"""Verdicts a broken model cannot pass (issue 20, item 4): every probe level reports what the model
still does (loss, KL of its outputs to the unshifted run), attention that is uniform everywhere reads
"degenerate", never "robust", `check --init` gates quality beside saturation with margins from the
spread across seeds, and a family the audit does not cover is marked unaudited (--strict refuses)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F
from typer.testing import CliRunner

import ssacli
from ssacli.attention import interface
from ssacli.cli import app
from ssacli.diagnosis.outputs import NEAR_UNIFORM_ENTROPY, OUTPUT_KL_HELD
from ssacli.models.icl import save_icl
from tests.helpers.cli import run_main
from tests.helpers.models import build_model

runner = CliRunner()


def _ids(samples=3, length=12, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, 128, (samples, length), generator=gen).tolist()


def _uniform(model):
    """Zero GPT-2's query and key projections: every logit 0, attention uniform over visible keys."""
    with torch.no_grad():
        for block in model.transformer.h:
            width = block.attn.c_attn.weight.shape[0]
            block.attn.c_attn.weight[:, : 2 * width] = 0
            block.attn.c_attn.bias[: 2 * width] = 0
    return model


def test_output_kl_per_level_is_the_kl_of_the_models_own_outputs():
    """output_kl at embed-scale σ is KL(p(σ=1) ‖ p(σ)) per token, recomputed here from the model's own
    forward with its token embeddings scaled by σ; the LM loss is its own cross-entropy."""
    model = build_model("gpt2", n_layer=2, n_head=2, n_embd=16)
    ids = _ids()
    result = ssacli.diagnose(model, ["embed-scale:1,4"], inputs=ids)
    probe = result.probe("embed-scale")
    tokens = torch.tensor(ids)
    with torch.no_grad():
        embeds = model.transformer.wte(tokens)
        logp = [F.log_softmax(model(inputs_embeds=embeds * s).logits.double(), -1) for s in (1.0, 4.0)]
    kl = (logp[0].exp() * (logp[0] - logp[1])).sum(-1).mean().item()
    loss = F.cross_entropy(logp[0][:, :-1].flatten(0, 1), tokens[:, 1:].flatten()).item()
    assert probe.extras["output_kl"][0] == 0.0 and kl > 1e-5  # the probe moved the outputs
    assert probe.extras["output_kl"][1] == pytest.approx(kl, rel=1e-4)
    assert probe.extras["loss"][0] == pytest.approx(loss, rel=1e-5)
    quality = json.loads(result.to_json())["probes"][0]["summary"]["quality"]
    assert quality["output_kl"][1] == pytest.approx(kl, rel=1e-4) and quality["reference_level"] == 1.0
    assert quality["outputs_held"] == [True, kl <= OUTPUT_KL_HELD]


def test_uniform_attention_reads_degenerate_never_robust():
    """Zeroed q/k: normalized entropy is exactly 1 in every layer, nothing collapses at any α (0·α = 0),
    and the outputs do not move; saturation alone would call it robust. It reads degenerate."""
    model = _uniform(build_model("gpt2", n_layer=2, n_head=2, n_embd=16))
    result = ssacli.diagnose(model, ["logit-scale:1,8,32"], inputs=_ids())
    probe = result.probe("logit-scale")
    assert probe.layer_mean("entropy")[0].min() >= 1 - 1e-6 >= NEAR_UNIFORM_ENTROPY
    assert probe.collapse_point() is None and probe.extras["output_kl"] == [0.0, 0.0, 0.0]
    broken = result.degenerate()
    assert broken is not None and broken["rule"] == "near_uniform"
    verdicts = result.verdicts()
    assert verdicts["logit-scale"]["verdict"] == "degenerate"
    kinds = [f["kind"] for f in result.findings()]
    assert kinds[0] == "degenerate"
    texts = " ".join(f["text"] for f in result.findings())
    assert "robust up to" not in texts and "degenerate" in texts
    data = json.loads(result.to_json())
    assert data["summary"]["degenerate"]["rule"] == "near_uniform"
    assert data["summary"]["verdicts"]["logit-scale"]["verdict"] == "degenerate"
    again = ssacli.DiagnoseResult.from_dict(data)  # and back
    assert again.verdicts() == verdicts


def _result(kl, entropy=0.5, collapse=(0.0, 0.0, 0.0)):
    """embed-scale at σ = 1, 4, 16 on 1 layer × 2 heads: a share ``collapse`` of the rows collapses
    at each level (none by default), entropy as given; the outputs moved by ``kl`` (nats/token)
    from σ = 1."""
    import numpy as np

    from ssacli.diagnosis.probe_result import ProbeResult
    from ssacli.diagnosis.result import DiagnoseResult

    grid = lambda v: np.full((3, 1, 2), v)  # noqa: E731
    rates = np.array(collapse, dtype=float).reshape(3, 1, 1).repeat(2, axis=2)
    metrics = {"collapse_rate": rates, "max_weight": grid(0.3), "entropy": grid(entropy)}
    probe = ProbeResult("embed-scale", [1.0, 4.0, 16.0], metrics, np.full((3, 1), 10),
                        extras={"output_kl": list(kl)},
                        layer_metrics={"logit_rms": np.array([[1.0], [4.0], [16.0]])})  # fmt: skip
    return DiagnoseResult("m", "gpt2", "softmax", "ssacli", ["l0"], [2], [probe])


def test_a_level_whose_outputs_broke_does_not_read_robust():
    """No collapse anywhere, the shift reached: robust while the outputs held (KL ≤ the bound at
    every level), 'outputs broke' at the first level past the bound."""
    held = _result([0.0, 0.05, OUTPUT_KL_HELD])
    assert held.verdicts()["embed-scale"]["verdict"] == "robust"
    assert any("robust up to σ=16" in f["text"] for f in held.findings())
    broke = _result([0.0, 0.05, 1.5 * OUTPUT_KL_HELD])
    verdict = broke.verdicts()["embed-scale"]
    assert verdict["verdict"] == "outputs broke" and verdict["level"] == 16.0
    assert all("robust" not in f["text"] or "not robust" in f["text"] for f in broke.findings())
    assert _result([0.0, 0.05, 0.05], entropy=0.99).verdicts()["embed-scale"]["verdict"] == "degenerate"


def test_a_probe_that_collapses_46_percent_of_the_rows_is_not_robust():
    """Below the collapse point (half the rows) but far above 'little collapse': outputs held, the
    shift reached, and still no 'robust' anywhere (the bundled ICL model's key-scale read 'robust up
    to σ=32' with 46 % of its rows collapsed)."""
    from ssacli.diagnosis.outputs import ROBUST_COLLAPSE

    partly = _result([0.0, 0.01, 0.02], collapse=(0.0, 0.05, 0.46))
    verdict = partly.verdicts()["embed-scale"]
    assert verdict["verdict"] == "partly collapses" and verdict["level"] == 16.0
    assert "46%" in verdict["text"] and f"{ROBUST_COLLAPSE:.0%}" in verdict["text"]
    assert all("robust" not in f["text"] or "not robust" in f["text"] for f in partly.findings())
    # at the bound itself it is still robust: 'little' is at most ROBUST_COLLAPSE
    edge = _result([0.0, 0.01, 0.02], collapse=(0.0, 0.05, ROBUST_COLLAPSE))
    assert edge.verdicts()["embed-scale"]["verdict"] == "robust"


# ---- check --init: a quality gate, margins from the spread across seeds -----------------------------


def _destroyed_icl(folder: Path) -> None:
    loaded = ssacli.load_model("builtin:every-softmax", device="cpu")
    with torch.no_grad():
        for block in loaded.model.backbone.h:
            width = block.attn.c_attn.weight.shape[0]
            block.attn.c_attn.weight[:, : 2 * width] = 0
            block.attn.c_attn.bias[: 2 * width] = 0
    save_icl(loaded.model, folder)


def _margins_stated(text: str) -> None:
    requires = tomllib.loads(text)["check"]["requires"]
    lines = text.splitlines()
    for expr in requires:  # every gate's comment states the spread and the margin it took
        at = next(i for i, line in enumerate(lines) if f'"{expr}"' in line)
        said = lines[at - 1]
        rule = "distance from uniform" if expr.startswith("entropy@") else "margin"  # anchored at uniform
        assert "± " in said and "seeds 0–2" in said and rule in said, expr


def test_init_gate_fails_destroyed_attention_and_the_healthy_model_passes_at_another_seed(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    made = runner.invoke(app, ["check", "--init"])
    assert made.exit_code == 0, made.output
    text = Path("ssacli.toml").read_text()
    _margins_stated(text)
    requires = tomllib.loads(text)["check"]["requires"]
    assert any(r.startswith("loss@") for r in requires) and any(r.startswith("entropy@") for r in requires)
    _destroyed_icl(tmp_path / "destroyed")
    broken = runner.invoke(app, ["check", "destroyed", "--config", "ssacli.toml", "--json", "broken.json"])
    assert broken.exit_code == 1, broken.output
    report = json.loads(Path("broken.json").read_text())
    failed = {r["expr"]: r["measured"] for r in report["requirements"] if not r["passed"]}
    entropy = next(e for e in failed if e.startswith("entropy@"))  # uniform attention, measured
    limit = float(entropy.split("<=")[1])
    assert failed[entropy] == pytest.approx(1.0, rel=1e-6) and limit < 1.0
    assert any(w.startswith("degenerate:") for w in report["warnings"])
    healthy = runner.invoke(app, ["check", "--seed", "7", "--json", "healthy.json"])
    assert healthy.exit_code == 0, healthy.output  # other inputs and targets: within the margins
    assert json.loads(Path("healthy.json").read_text())["result"]["settings"]["seed"] == 7


@pytest.mark.slow
def test_init_gate_on_a_language_model_fails_its_destroyed_copy_on_loss_and_entropy(tmp_path, monkeypatch):
    """The bundled LM: q/k zeroed and o_proj scrambled ×30 (uniform attention, outputs no better than
    uniform guessing, like the broken arm of docs/results/convert-smollm2.md) fails both the loss and
    the attention gate; the healthy model passes at another seed."""
    monkeypatch.chdir(tmp_path)
    assert runner.invoke(app, ["check", "builtin:wikitext-softmax", "--init"]).exit_code == 0
    loaded = ssacli.load_model("builtin:wikitext-softmax", device="cpu")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in loaded.model.model.layers:
            layer.self_attn.q_proj.weight.zero_()
            layer.self_attn.k_proj.weight.zero_()
            w = layer.self_attn.o_proj.weight
            w.copy_(30 * w.flatten()[torch.randperm(w.numel(), generator=gen)].view_as(w))
    loaded.model.save_pretrained("destroyed")
    loaded.tokenizer.save_pretrained("destroyed")
    broken = runner.invoke(app, ["check", "destroyed", "--config", "ssacli.toml", "--json", "b.json"])
    assert broken.exit_code == 1, broken.output
    failed = [r["expr"] for r in json.loads(Path("b.json").read_text())["requirements"] if not r["passed"]]
    assert any(e.startswith("loss@") for e in failed) and any(e.startswith("entropy@") for e in failed)
    assert runner.invoke(app, ["check", "builtin:wikitext-softmax", "--seed", "7", "-q"]).exit_code == 0


def test_quality_metrics_are_addressable_and_take_no_selector():
    from ssacli.check.requirements import parse_requirement, required_probes
    from ssacli.errors import UsageError

    assert parse_requirement("loss@embed-scale:1 <= 5").metric == "loss"
    assert required_probes([parse_requirement("output_kl@key-scale:8 <= 0.2")]) == ["key-scale:1,8"]
    for bad in ("loss@embed-scale:1 max <= 5", "output_kl@outlier:10[layer=0] <= 1"):
        with pytest.raises(UsageError, match="one number per probe level"):
            parse_requirement(bad)


# ---- unaudited families -----------------------------------------------------------------------------


def test_an_unaudited_family_is_marked_everywhere_and_strict_refuses_it(tmp_path, monkeypatch, capsys):
    """The audited set is AUDITED_FAMILIES (generated with docs/models.md): take gpt2 out of
    it and a gpt2 folder reads unaudited in diagnose's terminal line, JSON and HTML, check's warnings
    and convert's output; --strict refuses it with UnsupportedModelError's exit code (check: 3)."""
    folder = tmp_path / "gpt2"
    build_model("gpt2", n_layer=1, n_head=2, n_embd=16).save_pretrained(folder)
    assert interface.unaudited_reason("gpt2") is None
    monkeypatch.setattr(interface, "AUDITED_FAMILIES", interface.AUDITED_FAMILIES - {"gpt2"})
    probe = ["--probe", "logit-scale:1,2", "--samples", "2", "--random"]
    out = runner.invoke(app, ["diagnose", str(folder), *probe, "--json", str(tmp_path / "d.json"),
                              "--html", str(tmp_path / "d.html")])  # fmt: skip
    assert out.exit_code == 0, out.output
    assert "unaudited" in " ".join(out.output.split())
    assert "gpt2" in json.loads((tmp_path / "d.json").read_text())["unaudited"]
    assert "unaudited" in (tmp_path / "d.html").read_text()
    code, _, err = run_main(["diagnose", str(folder), *probe, "--strict"], monkeypatch, capsys)
    assert code == 3 and "--strict" in err and "Traceback" not in err
    req = ["-r", "collapse_rate@logit-scale:2 <= 1", "--samples", "2", "--random"]
    checked = runner.invoke(app, ["check", str(folder), *req, "--json", str(tmp_path / "c.json")])
    assert checked.exit_code == 0, checked.output
    assert any(w.startswith("unaudited:") for w in json.loads((tmp_path / "c.json").read_text())["warnings"])
    assert runner.invoke(app, ["check", str(folder), *req, "--strict"]).exit_code == 3
    convert = ["convert", str(folder), "--scorer", "softmax", "--out"]
    converted = runner.invoke(app, [*convert, str(tmp_path / "c")])
    assert converted.exit_code == 0, converted.output
    assert "unaudited" in converted.output
    code, _, err = run_main([*convert, str(tmp_path / "s"), "--strict"], monkeypatch, capsys)
    assert code == 3 and not (tmp_path / "s").exists() and "audit" in err


def test_no_collapse_with_unmeasured_outputs_is_not_coloured_like_a_pass():
    """A probe whose outputs were not measured reads "no collapse … not called robust"; reports colour
    it plainly, not green like "robust" (its attention held, nothing says the model did)."""
    from ssacli.diagnosis.verdicts import Verdict
    from ssacli.report.html import CSS, verdict_table
    from ssacli.report.terminal import VERDICT_STYLES

    robust = Verdict("key-scale", "robust", "robust up to σ=32 (shift reached ×28.9)")
    unmeasured = Verdict(
        "length", "no collapse", "no collapse up to ×2 (outputs not measured, so not called robust)"
    )
    broke = Verdict("dominant-key", "outputs broke", "outputs broke at M=16")
    assert (robust.tone, unmeasured.tone, broke.tone) == ("held", "unconfirmed", "failed")
    assert robust.severity == unmeasured.severity  # ordered alike, coloured apart
    html = verdict_table([broke, robust, unmeasured])
    assert '<tr class="held"><th>key-scale' in html and '<tr class="unconfirmed"><th>length' in html
    assert "tr.held td" in CSS and "unconfirmed" not in CSS
    assert VERDICT_STYLES["held"] == "green" and VERDICT_STYLES["unconfirmed"] == ""


def test_a_layer_collapsed_at_baseline_gives_its_finding_without_a_numpy_warning():
    """Layer 1's heads are all collapsed before any shift (an attention-only ICL model has whole
    layers so): the collapse finding names layer 0 from its own rates and no "Mean of empty slice"
    warning reaches the user's terminal (it leaked there from the fresh per-layer mean)."""
    import math
    import warnings

    import numpy as np

    from ssacli.diagnosis.probe_result import ProbeResult
    from ssacli.diagnosis.result import DiagnoseResult

    rates = np.zeros((3, 2, 2))
    rates[:, 1, :] = 0.9  # layer 1: collapsed at every level, baseline included
    rates[1:, 0, :] = [0.6, 0.8]  # layer 0: collapses from σ = 4
    grid = np.full((3, 2, 2), 0.95)
    metrics = {"collapse_rate": rates, "max_weight": grid, "entropy": np.full((3, 2, 2), 0.2)}
    rms = np.array([[1.0, 1.0], [4.0, 4.0], [16.0, 16.0]])
    probe = ProbeResult("embed-scale", [1.0, 4.0, 16.0], metrics, np.full((3, 2), 10),
                        layer_metrics={"logit_rms": rms})  # fmt: skip
    result = DiagnoseResult("m", "gpt2", "softmax", "ssacli", ["l0", "l1"], [2, 2], [probe])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found = [f for f in result.findings() if f["kind"] == "collapse"]
    assert [f["layers"] for f in found] == [[0]]
    assert found[0]["level"] == 4.0 and math.isclose(found[0]["value"], (0.6 + 0.8) / 2)
