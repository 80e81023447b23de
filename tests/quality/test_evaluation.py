"""Quality measures (ssacli.quality.measures) and `ssacli report`, against references computed here.

References never call the code under test: LM losses and sentence log-probs come from one forward
per predicted token (a plain loop over prefixes, or over single masked positions); two models are
rigged so that every log-prob is known in closed form; ICL errors come from ssacli.icl.evaluate
and probe deltas from two independent diagnose runs.
"""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch
from typer.testing import CliRunner

from ssacli import diagnose
from ssacli.cli import app
from ssacli.diagnosis.comparison import compare_results
from ssacli.errors import EXIT_INPUT, EXIT_USAGE, InputError, UsageError
from ssacli.icl.evaluate import evaluate
from ssacli.models.loading import LoadedModel, load_model
from ssacli.quality.compare import compare_models
from ssacli.quality.inputs import read_pairs
from ssacli.quality.measures import icl_error_by_sigma, language_model_loss, minimal_pairs
from tests.helpers.cli import run_main

WORDS = "the a cat dog man sat ran saw big small red old here there".split()
SPECIAL = ["[PAD]", "[UNK]", "[BOS]", "[CLS]", "[SEP]", "[MASK]"]
runner = CliRunner()


def make_tokenizer(bos: bool = True):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    named = dict(
        pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]"
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, **named, **({"bos_token": "[BOS]"} if bos else {}))


def tiny_gpt2(seed: int = 0, **overrides):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=len(SPECIAL + WORDS), n_embd=32, n_layer=2, n_head=4, n_positions=64,
        initializer_range=0.5, bos_token_id=2, eos_token_id=None, pad_token_id=0, **overrides,
    )  # fmt: skip
    return GPT2LMHeadModel(config).eval()


def tiny_bert(seed: int = 0, **overrides):
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(SPECIAL + WORDS), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=37, max_position_embeddings=64, initializer_range=0.5, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, pad_token_id=0, **overrides,
    )  # fmt: skip
    return BertForMaskedLM(config).eval()


def loaded(model, kind: str, tokenizer) -> LoadedModel:
    return LoadedModel(model, f"tiny-{kind}", model.config.model_type, kind, tokenizer, 64)


def random_text(words: int, seed: int = 1) -> str:
    gen = torch.Generator().manual_seed(seed)
    return " ".join(WORDS[i] for i in torch.randint(len(WORDS), (words,), generator=gen).tolist())


def ids_of(tokenizer, text: str) -> list[int]:
    vocab = tokenizer.get_vocab()
    return [vocab[w] for w in text.split()]  # the test's own tokenization: one id per word


# ---- naive references ---------------------------------------------------------------------------------


def next_token_logprob(model, prefix: list[int], token: int) -> float:
    """log p(token | prefix): one forward of the prefix alone, no batching, no padding."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prefix])).logits[0, -1].double()
    return float(torch.log_softmax(logits, -1)[token])


def masked_logprobs(model, ids: list[int], positions: list[int], mask_id: int) -> list[float]:
    """log p(true token) at each of ``positions``, all masked at once, in one forward."""
    masked = list(ids)
    for p in positions:
        masked[p] = mask_id
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([masked])).logits[0].double()
    return [float(torch.log_softmax(logits[p], -1)[ids[p]]) for p in positions]


def naive_causal_nll(model, ids: list[int], window: int, bos: int | None) -> tuple[float, int]:
    total, count = 0.0, 0
    body = window - (bos is not None)
    for start in range(0, len(ids), body):
        seq = ([bos] if bos is not None else []) + ids[start : start + body]
        for t in range(1, len(seq)):
            total -= next_token_logprob(model, seq[:t], seq[t])
            count += 1
    return total / count, count


def naive_sentence_logprob(model, tokenizer, sentence: str) -> float:
    seq = [tokenizer.bos_token_id, *ids_of(tokenizer, sentence)]
    return sum(next_token_logprob(model, seq[:t], seq[t]) for t in range(1, len(seq)))


def naive_pll(model, tokenizer, sentence: str) -> float:
    seq = [tokenizer.cls_token_id, *ids_of(tokenizer, sentence), tokenizer.sep_token_id]
    return sum(masked_logprobs(model, seq, [p], tokenizer.mask_token_id)[0] for p in range(1, len(seq) - 1))


# ---- language-model loss ------------------------------------------------------------------------------


@pytest.mark.parametrize("bos", [True, False])
def test_causal_loss_is_the_per_token_loop_over_windows(bos):
    tokenizer, model = make_tokenizer(bos), tiny_gpt2()
    text = random_text(40)  # windows of 8: five full ones, no remainder with BOS (7 each: 5 full + 5)
    got = language_model_loss(loaded(model, "causal", tokenizer), text, seq_len=8, batch_size=2)
    nll, count = naive_causal_nll(model, ids_of(tokenizer, text), 8, tokenizer.bos_token_id)
    assert got["tokens"] == count == (40 if bos else 40 - 5)
    assert got["nll"] == pytest.approx(nll, rel=1e-5)
    assert got["perplexity"] == pytest.approx(math.exp(nll), rel=1e-5)
    assert got["text_tokens"] == 40 and not got["truncated"]


def test_causal_loss_reads_only_the_first_max_tokens_of_a_long_text():
    tokenizer, model = make_tokenizer(), tiny_gpt2()
    text = random_text(3000, seed=2)  # far longer than max_tokens × 32 characters: the prefix cut applies
    got = language_model_loss(loaded(model, "causal", tokenizer), text, seq_len=16, max_tokens=20)
    nll, count = naive_causal_nll(model, ids_of(tokenizer, text)[:20], 16, tokenizer.bos_token_id)
    assert got["truncated"] and got["text_tokens"] == 20 and got["tokens"] == count == 20
    assert got["nll"] == pytest.approx(nll, rel=1e-5)


def test_masked_loss_with_every_token_masked_is_one_forward_per_window():
    tokenizer, model = make_tokenizer(), tiny_bert()
    ids = ids_of(tokenizer, text := random_text(20))
    got = language_model_loss(loaded(model, "masked", tokenizer), text, seq_len=8, mask_prob=1.0)
    total, count = 0.0, 0
    for start in range(0, len(ids), 6):  # CLS + 6 tokens + SEP
        chunk = ids[start : start + 6]
        seq = [tokenizer.cls_token_id, *chunk, tokenizer.sep_token_id]
        values = masked_logprobs(model, seq, list(range(1, len(seq) - 1)), tokenizer.mask_token_id)
        total -= sum(values)
        count += len(values)
    assert got["tokens"] == count == 20
    assert got["nll"] == pytest.approx(total / count, rel=1e-5)


def test_masked_loss_masks_a_seeded_share_and_each_scored_token_is_a_real_masked_loss():
    tokenizer, model = make_tokenizer(), tiny_bert()
    ids = ids_of(tokenizer, text := random_text(22))
    lm = loaded(model, "masked", tokenizer)
    runs = {seed: language_model_loss(lm, text, seq_len=8, mask_prob=0.15, seed=seed) for seed in (0, 0, 1)}
    chunks = [ids[s : s + 6] for s in range(0, len(ids), 6)]  # 6, 6, 6, 4 tokens: one masked in each
    assert runs[0]["tokens"] == sum(max(1, round(0.15 * len(c))) for c in chunks) == 4
    assert runs[0]["nll"] == language_model_loss(lm, text, seq_len=8, mask_prob=0.15, seed=0)["nll"]
    assert runs[1]["nll"] != runs[0]["nll"]
    for share in (0.5, 0.05):  # round(3) and round(2) masked; round(0.3) and round(0.2) -> at least one
        got = language_model_loss(lm, text, seq_len=8, mask_prob=share)["tokens"]
        assert got == sum(max(1, round(share * len(c))) for c in chunks) == (11 if share == 0.5 else 4)
    # One masked token per window: the total is one single-mask loss picked from each window.
    options = []
    for chunk in chunks:
        seq = [tokenizer.cls_token_id, *chunk, tokenizer.sep_token_id]
        options.append(
            [-masked_logprobs(model, seq, [p], tokenizer.mask_token_id)[0] for p in range(1, 7)[: len(chunk)]]
        )
    totals = [sum(pick) for pick in itertools.product(*options)]
    for run in runs.values():
        assert min(abs(t - run["nll"] * 4) for t in totals) < 1e-4


def test_loss_needs_a_language_model_with_a_tokenizer():
    icl = load_model("builtin:every-softmax")
    with pytest.raises(UsageError, match="causal or masked"):
        language_model_loss(icl, "the cat")
    with pytest.raises(InputError, match="tokenizer"):
        language_model_loss(loaded(tiny_gpt2(), "causal", None), "the cat")


# ---- minimal pairs -------------------------------------------------------------------------------------


PAIRS = [
    {"sentence_good": "the cat sat", "sentence_bad": "the dog sat"},
    {"sentence_good": "a dog ran here", "sentence_bad": "a cat ran here"},
    {"sentence_good": "the man saw a dog", "sentence_bad": "the man saw a man"},
    {"sentence_good": "a big red dog", "sentence_bad": "a big dog red"},
]


@pytest.mark.parametrize("kind", ["causal", "masked"])
def test_pair_scores_are_the_naive_sentence_log_likelihoods(kind):
    tokenizer = make_tokenizer()
    model = tiny_gpt2(seed=3) if kind == "causal" else tiny_bert(seed=3)
    got = minimal_pairs(loaded(model, kind, tokenizer), PAIRS, scores=True, batch_size=3)
    score = naive_sentence_logprob if kind == "causal" else naive_pll
    expected = [[score(model, tokenizer, p[k]) for k in ("sentence_good", "sentence_bad")] for p in PAIRS]
    entry = got["files"]["records"]
    assert entry["scores"] == [pytest.approx(e, abs=1e-4) for e in expected]
    wins = sum(good > bad for good, bad in expected)
    assert entry["correct"] == got["correct"] == wins and got["accuracy"] == wins / len(PAIRS)
    assert got["method"] == ("sum of token log-probs" if kind == "causal" else "pseudo-log-likelihood")


def rigged(kind: str, favored: str, logit: float):
    """A model whose every prediction is the same distribution: ``logit`` for ``favored``, 0 for the
    rest (the final hidden state is a constant, and the output layer reads only that constant)."""
    tokenizer = make_tokenizer()
    index = tokenizer.get_vocab()[favored]
    with torch.no_grad():
        if kind == "causal":
            model = tiny_gpt2(tie_word_embeddings=False)
            ln = model.transformer.ln_f
            ln.weight.zero_(), ln.bias.zero_()
            ln.bias[0] = 1.0
            model.lm_head.weight.zero_()
            model.lm_head.weight[index, 0] = logit
        else:
            model = tiny_bert(tie_word_embeddings=False)
            decoder = model.cls.predictions.decoder
            decoder.weight.zero_(), decoder.bias.zero_()
            decoder.bias[index] = logit
    return loaded(model, kind, tokenizer)


@pytest.mark.parametrize("kind", ["causal", "masked"])
def test_rigged_model_scores_are_known_in_closed_form_and_predict_the_winner(kind):
    c = 3.0
    lm = rigged(kind, "cat", c)
    vocab = len(SPECIAL + WORDS)
    log_z = math.log(math.exp(c) + vocab - 1)

    def hand(sentence: str) -> float:  # every scored token is a word of the sentence
        words = sentence.split()
        return c * words.count("cat") - len(words) * log_z

    got = minimal_pairs(lm, PAIRS, scores=True)["files"]["records"]
    expected = [[hand(p["sentence_good"]), hand(p["sentence_bad"])] for p in PAIRS]
    assert got["scores"] == [pytest.approx(e, abs=1e-4) for e in expected]
    # Pair 1: good has the cat (wins); pair 2: bad has it (loses); pairs 3 and 4 tie (count as wrong).
    assert got["correct"] == 1 and got["accuracy"] == 0.25


def test_pairs_from_files_per_file_and_overall(tmp_path):
    lm = rigged("causal", "cat", 3.0)
    folder = tmp_path / "blimp"
    folder.mkdir()
    (folder / "one.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PAIRS[:2]) + "\n")
    (folder / "two.jsonl").write_text("".join(json.dumps({**p, "UID": "x"}) + "\n" for p in [PAIRS[0]] * 3))
    (folder / "notes.txt").write_text("not pairs")
    got = minimal_pairs(lm, folder)
    assert {k: (v["pairs"], v["correct"]) for k, v in got["files"].items()} == {"one": (2, 1), "two": (3, 3)}
    assert got["pairs"] == 5 and got["correct"] == 4 and got["accuracy"] == 4 / 5
    assert got["mean_file_accuracy"] == pytest.approx((1 / 2 + 1) / 2)
    limited = minimal_pairs(lm, folder / "one.jsonl", limit=1)
    assert limited["files"] == {"one": {"pairs": 1, "correct": 1, "accuracy": 1.0}}


def test_bad_pair_files_name_the_file_and_line(tmp_path):
    good = json.dumps(PAIRS[0])
    cases = {
        "broken.jsonl": (f"{good}\n{{not json\n", "line 2"),
        "missing.jsonl": (f'{good}\n\n{{"sentence_good": "a cat"}}\n', "line 3"),
        "array.jsonl": ("[1, 2]\n", "line 1"),
        "empty.jsonl": ("\n  \n", "holds no pairs"),
    }
    for name, (content, words) in cases.items():
        (tmp_path / name).write_text(content)
        with pytest.raises(InputError, match=words) as info:
            read_pairs(tmp_path / name)
        assert name in str(info.value)
    (tmp_path / "latin1.jsonl").write_bytes(
        good.encode() + b"\n" + '{"sentence_good": "caf\xe9"}'.encode("latin-1")
    )
    with pytest.raises(InputError, match="latin1.jsonl', line 2 is not UTF-8"):
        read_pairs(tmp_path / "latin1.jsonl")
    (tmp_path / "none").mkdir()
    with pytest.raises(InputError, match="no .jsonl"):
        read_pairs(tmp_path / "none")
    with pytest.raises(InputError, match="does not exist"):
        read_pairs(tmp_path / "nowhere.jsonl")


# ---- ICL ---------------------------------------------------------------------------------------------


def test_icl_error_by_sigma_is_the_icl_evaluation():
    lm = load_model("builtin:every-softmax")
    got = icl_error_by_sigma(lm, sigmas=(4, 1), outliers=((100.0, 3),), length=21, prompts=40, seed=5)
    plain = evaluate(lm.model, sigmas=(1.0, 4.0), lengths=(21,), prompts=40, seed=5)
    planted = evaluate(lm.model, sigmas=(1.0,), lengths=(21,), outliers=((100.0, 3),), prompts=40, seed=5)
    assert [c["sigma"] for c in got["sigma"]] == [1.0, 4.0]  # σ = 1 always first: the reference
    assert [c["error"] for c in got["sigma"]] == [c.error for c in plain]
    assert [c["position_error"] for c in got["sigma"]] == [c.position_error for c in plain]
    assert got["in_distribution"]["error"] == plain[0].error
    assert [(c["outlier"], c["position"], c["error"]) for c in got["outliers"]] == [
        (100.0, 3, planted[0].error)
    ]
    assert got["task"] == "every" and got["headline"] == "error"


# ---- `ssacli report` ---------------------------------------------------------------------------------


ICL_ARGS = ["--probe", "outlier:1,100", "--sigma", "1,8", "--outlier", "100@3", "--prompts", "40"]


def test_report_on_the_bundled_icl_models(tmp_path):
    out, page = tmp_path / "r.json", tmp_path / "r.html"
    args = ["report", "builtin:every-softmax", "builtin:every-ssa", *ICL_ARGS, "--json", str(out)]
    result = runner.invoke(app, [*args, "--html", str(page)], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["schema"] == "ssacli-report" and data["schema_version"] == 1
    a = diagnose("builtin:every-softmax", ["outlier:1,100"], seed=0)
    b = diagnose("builtin:every-ssa", ["outlier:1,100"], seed=0)
    expected = compare_results(a, b)["deltas"]
    assert data["diagnose"]["deltas"].keys() == expected.keys() == {"outlier"}
    for metric, values in expected["outlier"].items():
        got = data["diagnose"]["deltas"]["outlier"][metric]
        assert [v is None for v in got] == [v is None for v in values], metric
        assert [v for v in got if v is not None] == pytest.approx(
            [v for v in values if v is not None], abs=1e-9
        )
    for side, ref in (("before", "builtin:every-softmax"), ("after", "builtin:every-ssa")):
        icl = data["measurements"][side]["icl"]
        direct = icl_error_by_sigma(load_model(ref), sigmas=(1, 8), outliers=((100.0, 3),), prompts=40)
        assert icl["sigma"] == direct["sigma"] and icl["outliers"] == direct["outliers"]
    rows = {r["key"]: r for r in data["quality"]}
    assert set(rows) == {"icl.1", "icl.8", "icl.1@100:3"}
    before, after = data["measurements"]["before"]["icl"], data["measurements"]["after"]["icl"]
    assert rows["icl.8"]["before"] == before["sigma"][1]["error"]
    assert rows["icl.8"]["after"] == after["sigma"][1]["error"]
    for row in rows.values():
        assert row["delta"] == pytest.approx(row["after"] - row["before"])
    assert "quality" in result.output and "ICL error σ=8" in result.output
    html = page.read_text()
    assert "<h2>quality</h2>" in html and "ICL error σ=8" in html and "<img" in html


def save_lm(folder, seed: int) -> str:
    make_tokenizer().save_pretrained(folder)
    tiny_gpt2(seed=seed).save_pretrained(folder)
    return str(folder)


def test_report_on_language_models_matches_the_api(tmp_path):
    before, after = save_lm(tmp_path / "a", 0), save_lm(tmp_path / "b", 1)
    (tmp_path / "id.txt").write_text(random_text(60))
    (tmp_path / "ood.txt").write_text(random_text(60, seed=9))
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    out = tmp_path / "r.json"
    files = ["--text-id", str(tmp_path / "id.txt"), "--text-ood", str(tmp_path / "ood.txt")]
    args = ["report", before, after, *files, "--pairs", str(tmp_path / "pairs.jsonl"), "--seq-len", "16"]
    result = runner.invoke(app, [*args, "--probe", "outlier:1,10", "--quiet", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert " ".join(result.output.split()) == f"wrote {out}"  # a long tmp path may wrap at 80 columns
    data = json.loads(out.read_text())
    rows = {r["key"]: r for r in data["quality"]}
    for side, ref in (("before", before), ("after", after)):
        lm = load_model(ref)
        for key, name in (("lm_id", "id.txt"), ("lm_ood", "ood.txt")):
            direct = language_model_loss(lm, (tmp_path / name).read_text(), seq_len=16)
            assert data["measurements"][side][key]["nll"] == pytest.approx(direct["nll"], rel=1e-6)
            assert rows[f"{key}.nll"][side] == pytest.approx(direct["nll"], rel=1e-6)
        assert data["measurements"][side]["pairs"]["accuracy"] == minimal_pairs(lm, PAIRS)["accuracy"]
    gap = rows["lm_gap.nll"]
    for side in ("before", "after"):
        nll = {k: data["measurements"][side][k]["nll"] for k in ("lm_id", "lm_ood")}
        assert gap[side] == pytest.approx(nll["lm_ood"] - nll["lm_id"])
    assert {"pairs.accuracy", "pairs.pairs", "lm_id.ppl", "lm_ood.ppl"} <= set(rows)
    assert data["settings"]["pairs"] == str(tmp_path / "pairs.jsonl") and data["notes"] == []


def test_heldout_of_uses_the_last_tenth_of_the_training_data(tmp_path):
    before, after = save_lm(tmp_path / "a", 0), save_lm(tmp_path / "b", 1)
    text = random_text(400)
    (tmp_path / "train.txt").write_text(text)
    out = tmp_path / "r.json"
    args = ["report", before, after, "--heldout-of", str(tmp_path / "train.txt"), "--seq-len", "16"]
    result = runner.invoke(app, [*args, "--probe", "outlier:1", "--quiet", "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    # Independently: the tail after 90 % of the characters, cut at the next whitespace.
    cut = int(len(text) * 0.9)
    while cut < len(text) and not text[cut].isspace():
        cut += 1
    tail = text[cut:].strip()
    assert len(tail) < 0.15 * len(text)
    direct = language_model_loss(load_model(before), tail, seq_len=16)
    assert data["measurements"]["before"]["lm_id"]["nll"] == pytest.approx(direct["nll"], rel=1e-6)
    assert data["settings"]["text_id"] == f"heldout:{tmp_path / 'train.txt'}"


def test_compare_models_refuses_models_of_two_kinds(tmp_path):
    with pytest.raises(InputError, match="compare models of one kind"):
        compare_models("builtin:every-softmax", save_lm(tmp_path / "lm", 0), probes=["outlier:1"])


def test_report_errors_are_one_line_with_their_code_and_leave_no_file(tmp_path, monkeypatch, capsys):
    (tmp_path / "empty.txt").write_text(" \n")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "bad.jsonl").write_text(json.dumps(PAIRS[0]) + "\n{oops\n")
    (tmp_path / "dir").mkdir()
    icl = ["builtin:every-softmax", "builtin:every-ssa"]
    cases = [
        ([*icl, "--text-id", str(tmp_path / "missing.txt")], EXIT_INPUT, "--text-id file"),
        ([*icl, "--text-ood", str(tmp_path / "empty.txt")], EXIT_INPUT, "empty"),
        ([*icl, "--text-id", str(tmp_path / "latin1.txt")], EXIT_INPUT, "not UTF-8"),
        ([*icl, "--pairs", str(tmp_path / "bad.jsonl")], EXIT_INPUT, "bad.jsonl', line 2"),
        ([*icl, "--pairs", str(tmp_path / "nowhere")], EXIT_INPUT, "does not exist"),
        ([*icl, "--pairs", str(tmp_path / "dir")], EXIT_INPUT, "no .jsonl"),
        ([*icl, "--sigma", "1,x"], EXIT_USAGE, "--sigma"),
        ([*icl, "--sigma", "0"], EXIT_USAGE, "--sigma"),
        ([*icl, "--outlier", "1000@x"], EXIT_USAGE, "VALUE@POSITION"),
        ([*icl, "--probe", "nope"], EXIT_USAGE, "unknown probe"),
        ([*icl, "--html", str(tmp_path / "dir")], EXIT_USAGE, "folder"),
        ([str(tmp_path / "nowhere"), "builtin:every-ssa"], EXIT_INPUT, "does not exist"),
        ([*icl, "--pairs", str(tmp_path / "ok.jsonl")], EXIT_USAGE, "needs causal or masked"),
    ]
    (tmp_path / "ok.jsonl").write_text(json.dumps(PAIRS[0]) + "\n")
    for args, code, words in cases:
        out = tmp_path / "out.json"
        exit_code, stdout, stderr = run_main(
            ["report", *args, "--quiet", "--json", str(out)], monkeypatch, capsys
        )
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert exit_code == code, (args, stderr)
        assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], (args, stderr)
        assert stdout == "" and not out.exists() and not list(tmp_path.glob(".out.json*")), args


def test_report_shows_the_conversion_and_the_fine_tuning_trajectory(tmp_path):
    from ssacli.conversion import convert
    from ssacli.report.before_after import render_report, report_html, trajectory_columns
    from ssacli.train.finetune import FinetuneConfig, finetune
    from ssacli.train.trajectory import read_trajectory

    before = save_lm(tmp_path / "a", 0)
    (tmp_path / "corpus.txt").write_text(random_text(400))
    convert(before, "ssa:init=faithful,learn=n", tmp_path / "conv")
    config = FinetuneConfig(data=str(tmp_path / "corpus.txt"), steps=2, batch_size=2, seq_len=16,
                            anneal_n=2.0, checkpoint_every=1)  # fmt: skip
    finetune(str(tmp_path / "conv"), config, tmp_path / "ft")
    report = compare_models(before, str(tmp_path / "ft"), probes=["outlier:1"], samples=2)
    after = report.conversion["after"]
    assert report.conversion["before"] == {}  # a plain transformers folder
    assert after["trajectory"] == read_trajectory(tmp_path / "ft") and len(after["trajectory"]) == 3
    assert [row["m"] for row in after["fidelity"]["layers"]]  # m=auto's choice travels along
    header, rows = trajectory_columns(after["trajectory"])
    n_column = header.index("n mean\n(min–max)")
    assert [r[0] for r in rows] == ["0", "1", "2"] and rows[-1][n_column].startswith("2 ")  # n annealed to 2
    page = report_html(report.to_dict())
    assert "fine-tuning trajectory" in page and 'alt="fine-tuning trajectory"' in page
    assert "m per layer (m=auto)" in page
    from rich.console import Console

    console = Console(record=True, width=160)
    render_report(report.to_dict(), console)
    assert "fine-tuning trajectory" in console.export_text()


def test_reuse_before_gives_the_report_measured_in_full(tmp_path):
    before, after = save_lm(tmp_path / "a", 0), save_lm(tmp_path / "b", 1)
    (tmp_path / "id.txt").write_text(random_text(60))
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    inputs = ["--text-id", str(tmp_path / "id.txt"), "--pairs", str(tmp_path / "pairs.jsonl")]
    common = [*inputs, "--seq-len", "16", "--probe", "outlier:1,10", "--quiet"]
    full, reused = tmp_path / "full.json", tmp_path / "reused.json"
    assert runner.invoke(app, ["report", before, after, *common, "--json", str(full)]).exit_code == 0
    args = ["report", before, after, *common, "--reuse-before", str(full), "--json", str(reused)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    a, b = json.loads(full.read_text()), json.loads(reused.read_text())
    for key in ("quality", "measurements", "before", "after", "settings"):
        assert a[key] == b[key], key

    def untimed(value):
        if isinstance(value, dict):
            return {k: untimed(v) for k, v in value.items() if "elapsed" not in k and "seconds" not in k}
        return [untimed(v) for v in value] if isinstance(value, list) else value

    assert untimed(a["diagnose"]) == untimed(b["diagnose"])
    other = [
        "report",
        before,
        after,
        *common[:-3],
        "--probe",
        "outlier:1",
        "--quiet",
        "--reuse-before",
        str(full),
    ]
    result = runner.invoke(app, other)
    assert isinstance(result.exception, UsageError) and "other settings (probes)" in str(result.exception)


def untimed(value):
    """A report's JSON without its timings (elapsed_s, seconds), key order kept."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if "elapsed" not in k and "seconds" not in k}
    return [untimed(v) for v in value] if isinstance(value, list) else value


def test_compare_models_returns_the_typed_report_whose_json_the_cli_writes(tmp_path):
    from ssacli import QualityReport

    before, after = save_lm(tmp_path / "a", 0), save_lm(tmp_path / "b", 1)
    (tmp_path / "id.txt").write_text(random_text(60))
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    out = tmp_path / "r.json"
    common = ["--seq-len", "16", "--probe", "outlier:1", "--samples", "2"]
    files = ["--text-id", str(tmp_path / "id.txt"), "--pairs", str(tmp_path / "pairs.jsonl")]
    result = runner.invoke(app, ["report", before, after, *files, *common, "--quiet", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = compare_models(
        before, after, text_id=tmp_path / "id.txt", pairs=tmp_path / "pairs.jsonl", seq_len=16,
        probes=["outlier:1"], samples=2,
    )  # fmt: skip
    assert isinstance(report, QualityReport) and report.lm_eval is None
    written = json.loads(out.read_text())
    assert list(written) == list(report.to_dict())  # every key, in the file's order
    assert untimed(written) == untimed(json.loads(json.dumps(report.to_dict())))
    assert report.settings["text_id"] == str(tmp_path / "id.txt") and report.settings["text_ood"] is None
    assert report.measurements["before"]["lm_id"]["nll"] == written["measurements"]["before"]["lm_id"]["nll"]


def test_compare_models_owns_reuse_before(tmp_path, monkeypatch):
    import ssacli.quality.compare as compare

    before, after = save_lm(tmp_path / "a", 0), save_lm(tmp_path / "b", 1)
    for name in ("id.txt", "other.txt"):
        (tmp_path / name).write_text(random_text(60))
    common = dict(seq_len=16, probes=["outlier:1"], samples=2, builtin=False)
    full = compare_models(before, after, text_id=tmp_path / "id.txt", **common)
    (tmp_path / "full.json").write_text(json.dumps(full.to_dict()))
    for earlier in (full, full.to_dict(), tmp_path / "full.json"):  # the report, its JSON, its file
        reused = compare_models(before, after, text_id=tmp_path / "id.txt", before_report=earlier, **common)
        assert reused.measurements["before"] == full.measurements["before"]
        assert reused.settings == full.settings
    (tmp_path / "list.json").write_text("[1, 2]")

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before --reuse-before was checked")

    monkeypatch.setattr(compare, "load_with", no_loading)
    cases = [
        (tmp_path / "other.txt", tmp_path / "full.json", "the report's text_id is"),
        (tmp_path / "id.txt", tmp_path / "missing.json", "not a readable JSON report"),
        (tmp_path / "id.txt", tmp_path / "list.json", "not a JSON object"),
    ]
    for text_id, earlier, words in cases:
        with pytest.raises(UsageError, match=words):
            compare_models(before, after, text_id=text_id, before_report=earlier, **common)
