"""'Reached' means the shift arrived: a magnitude probe's reach is measured where it acts (the target
key's logits for one-token probes), judged by the share of the asked shift that arrived (REACH_SHARE),
and a probe that did not arrive reads "absorbed by <module>" everywhere; the verdict block opens the
terminal and HTML reports, most severe first.

The measurement is checked against logits computed here from the model's own eager forward (the
q/k projections' outputs, hooked), and the rule on real runs: a pre-norm model absorbs `outlier`, the
attention-only ICL backbone (no normalization) lets it through in proportion to σ."""

from __future__ import annotations

import html
import json
import math
import re

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from ssacli import diagnose
from ssacli.cli import app
from ssacli.defaults import ICL_POINTS
from ssacli.diagnosis.plan import icl_batches, pad_sequences, pick_targets
from ssacli.diagnosis.probe_result import REACH_SHARE
from ssacli.diagnosis.result import DiagnoseResult
from ssacli.diagnosis.routes import is_norm
from ssacli.diagnosis.verdicts import SEVERITY, probe_verdicts
from ssacli.models.icl import ICLModel, ICLSpec, save_icl
from ssacli.testing import tiny_models
from tests.helpers.models import FAMILIES, VOCAB, build_model

OUTLIER = "outlier:1,10,100,1000"
ABSORBED = "absorbed by model.layers.0.input_layernorm — this probe cannot test this model; use key-scale"


def _ids(samples=4, length=24, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (samples, length), generator=gen).tolist()


def _plain(output: str) -> str:
    """Terminal output as one line of words: box characters and line breaks of the panels removed."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", output).split())


def _icl_model(seed=0) -> ICLModel:
    # "every" labels are ±1, so the probe scales the x tokens only (a linear task's y would scale too)
    torch.manual_seed(seed)
    return ICLModel(ICLSpec(task="every", arch="attn-only", layers=2, heads=2, width=16)).eval()


# ---- the measurement, against the model's own eager attention ----------------------------------------


def _target_logits_by_hand(qk_of_layer, target, valid, heads, inverse_layer=False) -> list[np.ndarray]:
    """Per layer: the logits q_i·k_t/√d on each sample's target key t, from every real query i ≠ t that
    a causal row sees it from (i > t), all heads; ``qk_of_layer``: (q, k) [b, t, h·d] per layer.
    ``inverse_layer``: GPT-2's scale_attn_by_inverse_layer_idx, logits ÷ (layer + 1)."""
    out = []
    for layer, (q, k) in enumerate(qk_of_layer):
        b, t, width = q.shape
        d = width // heads
        q = q.double().view(b, t, heads, d).transpose(1, 2)
        k = k.double().view(b, t, heads, d).transpose(1, 2)
        values = []
        for row in range(b):
            tgt = int(target[row])
            logits = q[row] @ k[row, :, tgt].unsqueeze(-1) / math.sqrt(d)  # [h, t, 1]
            if inverse_layer:
                logits = logits / (layer + 1)
            rows = [i for i in range(tgt + 1, t) if valid[row, i]]
            values.append(logits[:, rows, 0].flatten())
        out.append(torch.cat(values).numpy())
    return out


def _gpt2_qk(model, run) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(q, k) of every GPT-2 block from its c_attn projection's output (before any attention function)."""
    captured = []

    def hook(module, args, output):
        q, k, _ = output.split(output.shape[-1] // 3, dim=-1)
        captured.append((q.detach(), k.detach()))

    blocks = model.transformer.h if hasattr(model, "transformer") else model.backbone.h
    handles = [block.attn.c_attn.register_forward_hook(hook) for block in blocks]
    try:
        with torch.no_grad():
            run()
    finally:
        for handle in handles:
            handle.remove()
    return captured


def test_target_logits_match_the_eager_projections_on_a_prenorm_gpt2():
    """target_logit_rms and target_logit_mean per layer at σ = 1 and 1000, from hooked q/k of the
    model's own eager forward with the outlier applied here (the target token's embedding × σ)."""
    model = build_model("gpt2")  # scale_attn_by_inverse_layer_idx (fixtures/families.json)
    assert model.config.scale_attn_by_inverse_layer_idx
    ids = _ids()
    result = diagnose(model, [OUTLIER], inputs=ids)
    probe = result.probe("outlier")
    (batch,) = pad_sequences(ids, 0, 8)  # the run's one batch, and the targets it picks for this seed
    pick_targets([batch], 0)
    heads = model.config.n_head
    for index, sigma in ((0, 1.0), (3, 1000.0)):
        embeds = model.get_input_embeddings()(batch.input_ids).detach().clone()
        embeds[torch.arange(len(ids)), batch.target] *= sigma
        qk = _gpt2_qk(model, lambda e=embeds: model(inputs_embeds=e))
        logits = _target_logits_by_hand(qk, batch.target, batch.valid, heads, inverse_layer=True)
        rms = [float(np.sqrt(np.mean(v**2))) for v in logits]
        mean = [float(np.mean(v)) for v in logits]
        np.testing.assert_allclose(probe.layer_metrics["target_logit_rms"][index], rms, rtol=1e-5)
        np.testing.assert_allclose(probe.layer_metrics["target_logit_mean"][index], mean, rtol=1e-4)
    # pre-norm: ln_1 divides σ back out, so the target's logits barely move and the probe is absorbed
    assert probe.reached() is False and probe.absorbed_by() == "transformer.h.0.ln_1"


def test_target_logits_match_the_eager_projections_on_the_attention_only_icl_backbone():
    model = _icl_model()
    result = diagnose(model, [OUTLIER], samples=8)
    probe = result.probe("outlier")
    batches = icl_batches("every", 8, ICL_POINTS, 8, 0)  # the run's inputs (the default length, seed 0)
    pick_targets(batches, 0)
    (batch,) = batches
    for index, sigma in ((0, 1.0), (3, 1000.0)):
        xs = batch.xs.clone()
        xs[torch.arange(xs.shape[0]), batch.target // 2] *= sigma
        labels = torch.where(torch.cummin((xs > 0).to(torch.int8), dim=-1).values.bool(), 1.0, -1.0)
        tokens = torch.stack([xs, labels], dim=-1).flatten(1)
        qk = _gpt2_qk(model, lambda t=tokens: model(t))
        logits = _target_logits_by_hand(qk, batch.target, batch.valid, model.spec.heads)
        rms = [float(np.sqrt(np.mean(v**2))) for v in logits]
        np.testing.assert_allclose(probe.layer_metrics["target_logit_rms"][index], rms, rtol=1e-5)


# ---- the rule on real runs ---------------------------------------------------------------------------


def test_a_prenorm_llama_absorbs_outlier_in_the_cli_terminal_and_json(tmp_path):
    model = build_model("llama")
    model.save_pretrained(tmp_path / "llama")
    out = tmp_path / "out.json"
    args = ["diagnose", str(tmp_path / "llama"), "--probe", OUTLIER, "--probe", "key-scale:1,32",
            "--samples", "4", "--length", "24", "--random", "--json", str(out)]  # fmt: skip
    done = CliRunner().invoke(app, args, env={"COLUMNS": "100"})
    assert done.exit_code == 0, done.output
    text = _plain(done.output)
    assert f"outlier {ABSORBED}" in text  # the verdict line
    assert "outlier collapses at most" not in text and "did not reach" not in text
    assert text.index("verdict") < text.index("ssacli diagnose")  # the report opens with the verdict
    data = json.loads(out.read_text())
    summary = data["summary"]["collapse_status"]
    assert summary["outlier"] == "absorbed by model.layers.0.input_layernorm"
    probe = next(p for p in data["probes"] if p["name"] == "outlier")
    reach = probe["summary"]["reach"]
    assert reach["measure"] == "target_logit_rms" and reach["rule_share"] == REACH_SHARE
    assert reach["reached"] is False and reach["absorbed_layer"] == 0 and reach["level"] == 1000
    assert reach["absorbed_by"] == "model.layers.0.input_layernorm"
    assert len(reach["shift"]) == 4 and len(reach["shift"][0]) == 2  # per level, per layer
    for layer in range(2):  # the target's logits barely move: ×0.9–1.1 where ×1000 was asked
        assert 0.9 < reach["shift"][3][layer] < 1.1 and abs(reach["share"][3][layer]) < 0.05
    # the outlier's absorbed finding (the model's own facts, measured on that probe, rank before it)
    absorbed = next(f for f in data["findings"] if f.get("probe") == "outlier" and f["kind"] == "absorbed")
    assert ABSORBED in absorbed["text"]
    keys = next(p for p in data["probes"] if p["name"] == "key-scale")["summary"]["reach"]
    assert keys["reached"] is True and keys["share"][1] == pytest.approx([1.0, 1.0], rel=1e-3)
    # the JSON loads back into the same statements, and so does one written before the reach rule
    again = DiagnoseResult.from_dict(data)
    assert again.probe("outlier").collapse_status() == summary["outlier"]
    for p in data["probes"]:
        del p["absorbers"]
    older = DiagnoseResult.from_dict(data).probe("outlier")
    assert older.reached() is False and older.collapse_status() == "absorbed by layer 0's inputs"


def test_outlier_reaches_the_attention_only_icl_backbone_in_proportion_to_sigma(tmp_path):
    """The positive control: no normalization, so the target key grows with σ (share ≈ 1 in log
    space: ×σ on the keys, the queries of the other tokens unchanged in layer 0)."""
    save_icl(_icl_model(), tmp_path / "icl")
    out = tmp_path / "icl.json"
    args = ["diagnose", str(tmp_path / "icl"), "--probe", OUTLIER, "--json", str(out)]
    done = CliRunner().invoke(app, args, env={"COLUMNS": "100"})
    assert done.exit_code == 0, done.output
    text = _plain(done.output)
    assert "absorbed" not in text and "outlier" in text and "shift reached ×" in text
    (probe,) = json.loads(out.read_text())["probes"]
    reach = probe["summary"]["reach"]
    assert reach["reached"] is True and reach["absorbed_by"] is None and reach["layers"] == [True, True]
    for level in (1, 2, 3):  # every level after the first, every layer: the shift that was asked
        assert all(0.75 < share < 1.25 for share in reach["share"][level]), reach["share"]
    assert 1000**0.75 < min(reach["shift"][3]) < 1000**1.25


def test_dominant_key_reach_is_the_mean_shift_of_the_target_logits():
    result = diagnose(build_model("llama"), ["dominant-key:0,8"], inputs=_ids())
    probe = result.probe("dominant-key")
    # the probe adds M to every target logit the scorer sees: in layer 0 the mean moves by M exactly;
    # layer 1's own logits also move a little, since layer 0's attention changed under the probe
    shift = probe.reach_shift()[1]
    assert shift[0] == pytest.approx(8.0, rel=1e-6) and shift[1] == pytest.approx(8.0, rel=1e-3)
    assert probe.reach_measure() == "target_logit_mean" and probe.reached() is True


# ---- the verdict block ------------------------------------------------------------------------------


def test_verdicts_name_each_kind_and_list_those_that_tested_attention_first():
    ids = _ids()
    probes = ["length:1,2", OUTLIER, "embed-scale:1,1e30", "dominant-key:0,8"]
    result = diagnose(build_model("llama"), probes, inputs=ids)
    verdicts = probe_verdicts(result)
    lines = {v.probe: (v.kind, v.line) for v in verdicts}
    assert lines["dominant-key"] == ("saturates", "saturates at M=8 (collapse point)")
    assert lines["embed-scale"][0] == "overflow"
    assert lines["embed-scale"][1].startswith("overflow at σ=1e+30 (layer 0: model.layers.0.")
    assert lines["outlier"] == ("absorbed", ABSORBED)
    assert lines["length"][0] == "skipped"  # explicit inputs: their lengths are given
    # the probes that tested attention first, most severe first (overflow, saturates), then those
    # that could not test it (skipped, absorbed); ties in the order the probes ran
    assert [v.probe for v in verdicts] == ["embed-scale", "dominant-key", "length", "outlier"]
    # a trained (bundled) ICL model, pre-LayerNorm: outlier is absorbed, key-scale and logit-scale
    # arrive (×2 asked) and hold: they open the verdict, the absorbed probe (more severe) follows
    # (issue 51: "absorbed" lines opened the verdict ahead of the probe that did reach attention)
    trained = diagnose("builtin:every-softmax", ["key-scale:1,2", OUTLIER, "logit-scale:1,2"], samples=2)
    verdicts = probe_verdicts(trained)
    assert [(v.probe, v.kind, v.reached) for v in verdicts] == [
        ("key-scale", "robust", True), ("logit-scale", "robust", True), ("outlier", "absorbed", False)
    ]  # fmt: skip
    assert verdicts[2].line.startswith("absorbed by h.0.ln_1 — this probe cannot test this model")
    assert re.fullmatch(r"robust up to σ=2 \(shift reached ×(1\.99|2)\)", verdicts[0].line)
    na = diagnose(build_model("gpt2"), ["logit-scale:1,1000"], scorer="cosformer", inputs=ids)
    (verdict,) = probe_verdicts(na)
    assert (verdict.kind, verdict.line) == ("n/a", "n/a (scorer cannot respond)")
    assert SEVERITY["saturates"] < SEVERITY["absorbed"] == SEVERITY["n/a"] < SEVERITY["robust"]


def test_the_html_page_opens_with_the_verdict(tmp_path):
    from ssacli.report.html import diagnose_html

    result = diagnose(build_model("llama"), [OUTLIER, "dominant-key:0,8"], inputs=_ids())
    page = diagnose_html(result)
    verdict = page.index("<h2>verdict</h2>")
    assert verdict < page.index('<table class="facts">') and verdict < page.index("<h2>findings</h2>")
    block = page[verdict : page.index("</table>", verdict)]
    assert block.index("dominant-key") < block.index("outlier")  # saturates before absorbed
    assert "saturates at M=8 (collapse point)" in block and ABSORBED in block


def test_a_comparison_opens_with_both_verdicts_per_probe():
    """--compare (terminal and HTML) opens with A's and B's verdict per probe, the pair whose worse
    side is most severe first; each line is that model's own probe_verdicts line."""
    import io

    from rich.console import Console

    from ssacli.diagnosis.verdicts import probe_verdicts
    from ssacli.report.html import comparison_html
    from ssacli.report.terminal import render_comparison
    from tests.helpers.report_fixtures import result_a, result_b

    a, b = result_a(), result_b()
    lines_a = {v.probe: v.line for v in probe_verdicts(a)}
    lines_b = {v.probe: v.line for v in probe_verdicts(b)}
    console = Console(record=True, width=80, color_system=None, file=io.StringIO())
    render_comparison(a, b, console)
    text = console.export_text()
    assert text.index("verdict (A, B)") < text.index("ssacli diagnose: comparison")
    flat = " ".join(text.replace("│", " ").split())  # the panel's lines wrap inside its borders
    for name in lines_a:
        for side, line in (("A", lines_a[name]), ("B", lines_b[name])):
            assert " ".join(f"{side} {line}".split()) in flat, (name, side)
    page = comparison_html(a, b)
    verdict = page.index("verdict (A, B)</h2>")
    block = page[verdict : page.index("</table>", verdict)]
    for name in lines_a:
        assert all(html.escape(lines[name], quote=True) in block for lines in (lines_a, lines_b)), name
    worst = {name: min(v.severity for v in (*probe_verdicts(a), *probe_verdicts(b)) if v.probe == name)
             for name in lines_a}  # fmt: skip
    shown = sorted(lines_a, key=lambda name: block.index(f"<th>{name}</th>"))
    assert [worst[name] for name in shown] == sorted(worst.values())


# ---- the rule itself, on hand-written arrays -----------------------------------------------------------


def _hand_probe(name, levels, measure, values, absorbers=()):
    from tests.helpers.report_fixtures import probe_result

    zeros = np.zeros((len(levels), 2, 3))
    probe = probe_result(name, levels, zeros, zeros + 0.2)
    probe.layer_metrics[measure] = np.asarray(values, dtype=float)
    probe.absorbers = list(absorbers)
    return probe


def test_reached_needs_half_the_asked_shift_in_log_space_in_every_layer():
    # σ = 100 asked: ×10 = 100^0.5 is the line. Layer 0 gets ×12 (share 0.54), layer 1 ×9 (0.48).
    probe = _hand_probe("outlier", [1, 100], "target_logit_rms", [[2.0, 3.0], [24.0, 27.0]],
                        ["embeddings.norm", "layers.0.post_norm"])  # fmt: skip
    share = probe.reach_share()[1]
    assert share == pytest.approx([math.log(12) / math.log(100), math.log(9) / math.log(100)])
    assert probe.reached_layers() == [True, False] and probe.reached() is False
    assert probe.absorbed_layer() == 1 and probe.absorbed_by() == "layers.0.post_norm"
    (verdict,) = probe_verdicts([probe])
    assert verdict.line == "absorbed by layers.0.post_norm — this probe cannot test this model; use key-scale"
    from ssacli.diagnosis.findings import findings

    (found,) = [f for f in findings([probe], [3, 3]) if f["kind"] == "absorbed"]
    assert found["text"].endswith("(target key's logits ×9 at σ=100, ×100 asked; it reached layers 0 only)")
    # both layers at ×11 (share 0.52): reached, and the robust line gives the least shift
    probe = _hand_probe("outlier", [1, 100], "target_logit_rms", [[2.0, 3.0], [22.0, 33.0]])
    probe.extras["output_kl"] = [0.0, 0.01]  # and its outputs held
    assert probe.reached() is True and probe.absorbed_by() is None
    assert probe_verdicts([probe])[0].line == "robust up to σ=100 (shift reached ×11)"
    # an offset (dominant-key, M from 0 to 16): the target logits' mean must move by at least 8
    probe = _hand_probe("dominant-key", [0, 16], "target_logit_mean", [[1.0, 1.0], [8.5, 10.0]])
    assert probe.reach_share()[1] == pytest.approx([7.5 / 16, 9 / 16]) and probe.reached() is False
    assert probe.absorbed_by() == "layer 0's inputs"  # no norm recorded (a result from before the rule)
    assert "use key-scale" not in probe_verdicts([probe])[0].line  # it acts on the logits themselves


# ---- what counts as a normalization (the absorbers), by behaviour -------------------------------------


def _norms_by_behaviour(model, kind: str) -> tuple[set[str], set[str]]:
    """(leaves that ran on a float input, those among them that normalize): a module whose output is
    shaped as its input, changes with it, and is the same for the input scaled by 100 and by 400 (a
    LayerNorm or RMSNorm, whose epsilon is negligible at that size; a linear map, an activation or
    an affine is not)."""
    leaves = {n: m for n, m in model.named_modules() if not list(m.children())}
    calls: dict[str, tuple] = {}

    def capture(name):
        def hook(module, args, kwargs):
            if name not in calls and args and torch.is_tensor(args[0]) and args[0].is_floating_point():
                calls[name] = (args, kwargs)

        return hook

    handles = [m.register_forward_pre_hook(capture(n), with_kwargs=True) for n, m in leaves.items()]
    ids = torch.randint(3, VOCAB, (2, 6), generator=torch.Generator().manual_seed(0))
    extra = {"decoder_input_ids": ids} if kind == "seq2seq" else {}
    with torch.no_grad():
        model(input_ids=ids, **extra)
        for handle in handles:
            handle.remove()
        found = set()
        for name, (args, kwargs) in calls.items():
            x, rest = args[0], args[1:]
            out = leaves[name](x, *rest, **kwargs)
            if not torch.is_tensor(out) or out.shape != x.shape:
                continue
            moved = leaves[name](
                x + torch.randn(x.shape, generator=torch.Generator().manual_seed(1)), *rest, **kwargs
            )
            small, large = (leaves[name](c * x, *rest, **kwargs) for c in (100.0, 400.0))
            if not torch.allclose(moved, out) and torch.allclose(small, large, rtol=1e-4, atol=1e-6):
                found.add(name)
    return set(calls), found


@pytest.mark.parametrize("family", [*FAMILIES, "mobilebert", "olmo", "deepseek_v4"])
def test_the_norms_diagnose_watches_are_the_modules_that_normalize(family):
    """diagnose tells a norm by what it is (routes.is_norm), every conftest family and three that a
    class name misleads or a weight-and-epsilon rule would miss: MobileBERT's NoNorm (an affine, no
    normalization), OLMo's LayerNorm without parameters, DeepSeek-V4's RMSNorms without a weight."""
    if family in FAMILIES:
        model, kind = build_model(family), FAMILIES[family]["kind"]
    else:
        kind = tiny_models.families()[family]
        model = tiny_models.build_tiny(family, kind)
    ran, normalizing = _norms_by_behaviour(model, kind)
    modules = dict(model.named_modules())
    assert normalizing and {name for name in ran if is_norm(modules[name])} == normalizing
