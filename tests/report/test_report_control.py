"""`ssacli report ORIGINAL SSA CONTROL` (issue 37): a third model, the softmax control trained with the
SSA arm's budget, measured and probed on the same inputs and put beside BEFORE and AFTER.

The three folders are made here once (the bundled softmax LM, its recipe conversion with tiny budgets,
and the softmax control of the same budget); every expected number is measured here directly with
the public measures (or computed from two numbers the report wrote), never read back as the answer.
"""

from __future__ import annotations

import json
import math
import random

import pytest
from typer.testing import CliRunner

from ssacli.cli import app
from ssacli.models.loading import load_model
from ssacli.quality.builtin import BUILTIN_PAIRS
from ssacli.quality.compare import compare_models
from ssacli.quality.measures import language_model_loss, minimal_pairs
from ssacli.report.before_after import fmt_change, fmt_value
from ssacli.train.data import heldout_text
from tests.helpers.cli import run_main

ORIGINAL = "builtin:wikitext-softmax"
WORDS = "the of and in a to was is for on as by with his at from that it an are were which this".split()
MEASURE = ["--seq-len", "32", "--max-tokens", "512", "--probe", "key-scale:1,8", "--samples", "2"]
SETTINGS = dict(seq_len=32, max_tokens=512, probes=["key-scale:1,8"], samples=2)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The text (900 lines of common words), the SSA arm and its softmax control."""
    from ssacli.train.recipe import RecipeConfig, convert_with_recipe, softmax_control

    root = tmp_path_factory.mktemp("control-report")
    rng = random.Random(0)
    text = root / "text.txt"
    text.write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(14)) + " ." for _ in range(900)))
    config = RecipeConfig(data=str(text), transfer_steps=2, distill_steps=2, eval_every=2, batch_size=2,
                          seq_len=32, heldout_tokens=320)  # fmt: skip
    convert_with_recipe(ORIGINAL, root / "ssa", config, device="cpu")
    softmax_control(ORIGINAL, root / "control", config, device="cpu")
    return {"root": root, "text": str(text), "ssa": str(root / "ssa"), "control": str(root / "control")}


@pytest.fixture(scope="module")
def three(folders, tmp_path_factory):
    """The command's three-model report at 80 columns: (terminal text, JSON document, HTML page)."""
    out = tmp_path_factory.mktemp("three")
    args = ["report", ORIGINAL, folders["ssa"], folders["control"], "--heldout-of", folders["text"],
            *MEASURE, "--json", str(out / "r.json"), "--html", str(out / "r.html")]  # fmt: skip
    result = CliRunner().invoke(app, args, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return result.stdout, json.loads((out / "r.json").read_text()), (out / "r.html").read_text()


def untimed(value):
    """A report part without its timings (elapsed_s, seconds), key order kept."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if "elapsed" not in k and "seconds" not in k}
    return [untimed(v) for v in value] if isinstance(value, list) else value


def test_each_quality_row_holds_three_models_and_after_against_control(folders, three):
    _, data, _ = three
    rows = {r["key"]: r for r in data["quality"]}
    assert {"lm_id.nll", "lm_id.ppl", "pairs.accuracy", "pairs.anaphor_agreement"} <= set(rows)
    for row in rows.values():
        assert None not in (row["before"], row["after"], row["control"]), row["key"]
        assert row["delta_control"] == pytest.approx(row["after"] - row["control"], abs=1e-12), row["key"]
        assert row["delta"] == pytest.approx(row["after"] - row["before"], abs=1e-12), row["key"]
    # The same inputs for all three: each side's held-out loss and pair accuracy, measured here.
    tail, direct = heldout_text(folders["text"]), {}
    for side, ref in (("before", ORIGINAL), ("after", folders["ssa"]), ("control", folders["control"])):
        lm = load_model(ref, device="cpu")
        direct[side] = language_model_loss(lm, tail, seq_len=32, max_tokens=512)["nll"]
        assert rows["lm_id.nll"][side] == pytest.approx(direct[side], rel=1e-6), side
        assert rows["pairs.accuracy"][side] == minimal_pairs(lm, BUILTIN_PAIRS)["accuracy"], side
    assert rows["lm_id.nll"]["delta_control"] == pytest.approx(direct["after"] - direct["control"], abs=1e-5)
    assert direct["after"] != direct["control"]  # two different models: the column has something to say


def test_json_puts_the_control_beside_before_and_after(folders, three):
    from ssacli import diagnose
    from ssacli.diagnosis.comparison import compare_results
    from ssacli.diagnosis.result import DiagnoseResult

    _, data, _ = three
    assert data["schema"] == "ssacli-report" and data["schema_version"] == 1
    assert list(data)[2:5] == ["before", "after", "control"]
    control_side = dict(data["control"])
    weights = control_side.pop("weights")  # which weights were measured: the folder's content hash
    assert weights["files"] == 1 and len(weights["sha256"]) == 64
    assert weights != data["after"]["weights"]  # the control's weights are not the SSA arm's
    expected = {"model": folders["control"], "family": "llama", "kind": "causal", "scorer": "softmax"}
    assert control_side == expected
    assert list(data["measurements"]) == list(data["conversion"]) == ["before", "after", "control"]
    assert data["conversion"]["control"]["recipe"]["control"] is True
    assert "control" not in data["conversion"]["after"]["recipe"]  # an SSA arm's record as it was
    probes = data["diagnose_control"]  # CONTROL as A, AFTER as B: Δ = AFTER − CONTROL
    assert probes["a"]["model"] == folders["control"] and probes["b"] == data["diagnose"]["b"]
    control = diagnose(folders["control"], ["key-scale:1,8"], seed=0, samples=2, device="cpu")
    expected = compare_results(control, DiagnoseResult.from_dict(data["diagnose"]["b"]))["deltas"]
    assert expected.keys() == probes["deltas"].keys() == {"key-scale"}
    for metric, values in expected["key-scale"].items():
        got = probes["deltas"]["key-scale"][metric]
        assert [v is None for v in got] == [v is None for v in values], metric
        wanted = [v for v in values if v is not None]
        assert [v for v in got if v is not None] == pytest.approx(wanted, abs=1e-6), metric


def test_without_control_the_report_is_the_two_model_one(folders, three):
    _, data, _ = three
    two = compare_models(ORIGINAL, folders["ssa"], heldout_of=folders["text"], device="cpu", **SETTINGS)
    two = two.to_dict()
    assert list(two) == [k for k in data if k not in ("control", "decision", "diagnose_control")]
    for row, wide in zip(two["quality"], data["quality"], strict=True):
        assert list(row) == ["key", "label", "before", "after", "delta", "better"]
        assert row == {k: wide[k] for k in row}
    for key in ("before", "after"):
        assert two[key] == data[key]
        # a CONTROL adds the in-domain text at a longer context (the decision's question), nothing else
        wide = {k: v for k, v in data["measurements"][key].items() if not k.endswith("_long")}
        assert two["measurements"][key] == wide
        assert two["conversion"][key] == data["conversion"][key]
    assert untimed(two["diagnose"]) == untimed(data["diagnose"])


def test_the_three_column_table_reads_whole_at_80_columns(folders, three):
    text, data, page = three
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("quality"))
    end = next(i for i in range(start + 4, len(lines)) if not lines[i].strip())
    table = lines[start:end]
    assert max(len(line) for line in lines) <= 80 and "…" not in "\n".join(table)
    assert table[2].split() == ["Δ", "vs", "Δ", "vs", "better"]
    assert table[3].split() == ["measure", "BEFORE", "AFTER", "CONTROL", "BEFORE", "CONTROL", "if"]
    for row in data["quality"]:  # every row's cells whole, in the columns' order, on one line
        cells = [fmt_value(row[k]) for k in ("before", "after", "control")]
        cells += [fmt_change(row["delta"]), fmt_change(row["delta_control"]), row["better"]]
        assert any(line.split()[-6:] == cells for line in table), (row["key"], cells)
    assert "CONTROL recipe" in text and "softmax control:" in text
    assert "attention probes: AFTER against CONTROL (A = CONTROL, B = AFTER)" in text
    assert "<th>CONTROL</th><th>Δ vs BEFORE</th><th>Δ vs CONTROL</th>" in page
    assert f"vs {folders['control']}</title>" in page
    assert "<h2>attention probes: AFTER against CONTROL (A = CONTROL, B = AFTER)</h2>" in page
    nll = next(r for r in data["quality"] if r["key"] == "lm_id.nll")
    better = "better" if nll["delta_control"] < 0 else "worse"
    assert f"<td>{fmt_value(nll['control'])}</td>" in page
    assert f'<td class="{better}">{fmt_change(nll["delta_control"])}</td>' in page


def other_vocabulary_lm(folder) -> str:
    """A tiny causal LM (GPT-2) with a word-level tokenizer of its own: another vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    words = ["[UNK]", "[BOS]", *WORDS]
    tokenizer = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", bos_token="[BOS]")
    fast.save_pretrained(folder)
    config = GPT2Config(vocab_size=len(words), n_embd=32, n_layer=1, n_head=2, n_positions=64,
                        bos_token_id=1, eos_token_id=1)  # fmt: skip
    GPT2LMHeadModel(config).save_pretrained(folder)
    return str(folder)


def test_a_control_of_another_vocabulary_or_kind_is_refused(folders, tmp_path, monkeypatch, capsys):
    from ssacli.errors import EXIT_INPUT, EXIT_USAGE

    other = other_vocabulary_lm(tmp_path / "other")
    capsys.readouterr()  # what saving it printed
    pair = [ORIGINAL, folders["ssa"]]
    cases = [
        ([*pair, other, "--heldout-of", folders["text"]], EXIT_USAGE, "another vocabulary than AFTER"),
        ([*pair, other], EXIT_USAGE, "another vocabulary than AFTER"),  # the built-in texts and pairs
        ([*pair, "builtin:every-softmax"], EXIT_INPUT, "CONTROL 'builtin:every-softmax'"),
    ]
    for args, code, words in cases:
        out = tmp_path / "out.json"
        exit_code, stdout, stderr = run_main(
            ["report", *args, *MEASURE, "--quiet", "--json", str(out)], monkeypatch, capsys
        )
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert exit_code == code, (args, stderr)
        assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], (args, stderr)
        assert stdout == "" and not out.exists(), args


def test_lm_eval_holds_after_against_the_control(folders, tmp_path):
    pytest.importorskip("lm_eval")
    records = [r for group in BUILTIN_PAIRS.values() for r in group][:8]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    task = tmp_path / "ssacli_pairs.yaml"  # log P(good) against log P(bad), with an empty context
    task.write_text(
        f"task: ssacli_pairs\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {tmp_path / 'pairs.jsonl'}\n  cache_dir: {tmp_path / 'hf-cache'}\n"
        'test_split: test\noutput_type: multiple_choice\ndoc_to_text: ""\ntarget_delimiter: ""\n'
        'doc_to_choice: "{{[sentence_good, sentence_bad]}}"\ndoc_to_target: 0\n'
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
    )
    out, html = tmp_path / "r.json", tmp_path / "r.html"
    args = ["report", ORIGINAL, folders["ssa"], folders["control"], "--lm-eval", str(task), "--no-builtin",
            "--samples", "1", "--probe", "key-scale:1", "--device", "cpu", "--json", str(out),
            "--html", str(html)]  # fmt: skip
    result = CliRunner().invoke(app, args, env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    # no text and no σ = 8: the decision has nothing to decide on, and says so
    rule = data["decision"]["rule"]
    assert (rule["verdict"], rule["recommended"]) == ("undecided", None)
    assert data["decision"]["questions"] == []
    assert "--probe key-scale:1,8" in rule["why"] and "undecided: this run's intervals" in result.stdout
    (row,), (held,) = data["lm_eval"]["rows"], data["lm_eval"]["control_rows"]
    scores = minimal_pairs(load_model(folders["control"], device="cpu"), records, scores=True)
    correct = [1.0 if good > bad else 0.0 for good, bad in scores["files"]["records"]["scores"]]
    assert held["before"] == pytest.approx(sum(correct) / len(correct), abs=1e-12)  # CONTROL's accuracy
    assert held["after"] == row["after"] and held["n"] == len(records)
    assert held["delta"] == pytest.approx(held["after"] - held["before"], abs=1e-12)
    runs = {
        side: data["measurements"][side]["lm_eval"]["tasks"]["ssacli_pairs"]["items"]
        for side in data["measurements"]
    }
    items = sorted(runs["control"], key=lambda item: item["doc_id"])  # CONTROL's, not BEFORE's, scores
    for item, expected in zip(items, scores["files"]["records"]["scores"], strict=True):
        assert item["loglikelihoods"] == pytest.approx(expected, rel=1e-5), item["doc_id"]
    assert runs["control"] != runs["before"] and runs["control"] != runs["after"]
    title = "benchmarks (lm-evaluation-harness): AFTER against CONTROL"
    assert title in result.stdout and "CONTROL ± SE" in result.stdout
    assert title in html.read_text() and f"{held['before']:.4f} ± " in html.read_text()


# ---- the decision (issue 51, item 5) ----------------------------------------------------------------


def test_the_three_way_report_opens_with_the_decision_and_its_intervals(folders, three):
    """The first lines: one per question with its interval, the recommendation by the rule applied to
    these numbers; the JSON holds the same decision. Each interval is recomputed here from the
    per-window losses and per-prompt output KLs the report kept, which must add up to its means."""
    text, data, page = three
    lines = text.splitlines()
    assert "decision: AFTER against CONTROL" in lines[0] and max(map(len, lines)) <= 80
    assert list(data)[2:6] == ["before", "after", "control", "decision"]
    from ssacli.quality.tradeoff import apply_rule
    from ssacli.report.decision import recommendation_text
    from ssacli.stats import bootstrap_ci

    decision = data["decision"]
    questions = {q["key"]: q for q in decision["questions"]}
    assert list(questions) == ["lm_id", "lm_id_long", "output_kl.key-scale@8"]  # no --text-ood: a note
    assert any("out-of-domain: not measured (--text-ood FILE)" in n for n in decision["notes"])
    a, c = data["measurements"]["after"], data["measurements"]["control"]
    for key in ("lm_id", "lm_id_long"):
        for side in (a, c):  # the windows add up to the measured mean
            assert sum(side[key]["window_nll"]) / sum(side[key]["window_tokens"]) == pytest.approx(
                side[key]["nll"], rel=1e-12
            )
        pairs = zip(
            a[key]["window_nll"], a[key]["window_tokens"], c[key]["window_nll"], c[key]["window_tokens"]
        )
        diffs = [x / n - y / m for x, n, y, m in pairs]  # AFTER − CONTROL, window by window
        low, high = bootstrap_ci(diffs)
        assert questions[key]["value"] == pytest.approx(math.exp(sum(diffs) / len(diffs)), rel=1e-12)
        bounds = (questions[key]["low"], questions[key]["high"])
        assert bounds == pytest.approx((math.exp(low), math.exp(high)), rel=1e-12)
        assert questions[key]["units"] == len(diffs) == a[key]["windows"]
    assert c["lm_id_long"]["seq_len"] == 64  # twice the 32-token windows: the model has 128 positions
    index = data["diagnose"]["b"]["probes"][0]["levels"].index(8)
    per_prompt = {}
    for side, result in (("after", data["diagnose"]["b"]), ("control", data["diagnose_control"]["a"])):
        probe = result["probes"][0]
        per_prompt[side] = probe["per_input"]["output_kl"][index]
        # prompts of one length: their mean is the level's output KL the probe table shows
        assert sum(per_prompt[side]) / 2 == pytest.approx(probe["extras"]["output_kl"][index], rel=1e-9)
    base = sum(per_prompt["control"]) / 2
    change = (sum(per_prompt["after"]) - sum(per_prompt["control"])) / 2 / base
    assert questions["output_kl.key-scale@8"]["value"] == pytest.approx(change, rel=1e-9)
    rule = apply_rule(questions["lm_id"], questions["output_kl.key-scale@8"])
    assert {k: decision["rule"][k] for k in rule} == rule  # the rule applied to these numbers
    end = next(i for i, line in enumerate(lines) if line.startswith("╰"))  # the panel's last line
    block = " ".join(" ".join(line.strip("│ ").split()) for line in lines[: end + 1])
    for q in decision["questions"]:
        assert q["label"] in block and q["reads"] in block, q["key"]
    assert " ".join(("recommendation: " + recommendation_text(decision)).split()) in block
    assert "decision: AFTER against CONTROL, from this run</h2>" in page


def test_the_header_shows_the_final_models_n_and_its_kl_to_the_original_now(folders, three):
    """AFTER runs at n = 4 (the recipe's target), not at the spec its folder keeps
    (``ssa:init=faithful,learn=b+n``); its KL to BEFORE is measured now, on the held-out windows, and
    the conversion's fidelity is labelled as the faithful start's."""
    import torch

    from ssacli.attention.interface import scorers_of

    text, data, _ = three
    flat = " ".join(text.replace("│", " ").split())  # borders out: rich wraps where the path leaves room
    after = load_model(folders["ssa"], device="cpu")
    n = [float(s.parameter_values()["n"].mean()) for s in scorers_of(after.attention_root).values()]
    assert n == pytest.approx([4.0] * len(n), rel=1e-5)
    assert data["after"]["scorer_values"]["n"] == pytest.approx(n, rel=1e-5)
    assert f"ssa, n per layer 4 in all {len(n)} layers" in flat
    # KL(BEFORE ‖ AFTER) per token, here from the two models' logits on the held-out windows
    before = load_model(ORIGINAL, device="cpu")
    tokenizer = after.tokenizer
    ids = tokenizer(heldout_text(folders["text"]), add_special_tokens=False)["input_ids"][:512]
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    body = 32 - len(bos)
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ids), body):
            window = torch.tensor([bos + ids[start : start + body]])
            if window.shape[1] < 2:
                continue
            p = torch.log_softmax(before.model(window).logits.double(), -1)[0, :-1]
            q = torch.log_softmax(after.model(window).logits.double(), -1)[0, :-1]
            total += float((p.exp() * (p - q)).sum())
            count += p.shape[0]
    now = data["measurements"]["after"]["kl_to_before"]
    assert now["kl_per_token"] == pytest.approx(total / count, rel=1e-4) and now["tokens"] == count
    assert f"AFTER now KL to BEFORE {now['kl_per_token']:.3g} nats/token on {count:,} tokens" in flat
    start = data["conversion"]["after"]["fidelity"]["kl_per_token"]
    assert f"fidelity at start KL {start:.3g} nats/token at conversion (faithful start)" in flat
    assert abs(now["kl_per_token"] - start) > 1e-3 * start  # the two numbers are different facts
