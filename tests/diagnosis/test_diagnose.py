"""ssacli.diagnose end to end, against references it does not compute itself.

The reference for a transformers model is its own eager path run with ``output_attentions=True``
(full weight maps), reduced by :func:`naive_metrics`, a plain-Python loop over every query row
that follows the metric definitions of ssacli/metrics.py. Probes are reproduced by other means
than the code under test: scaled embeddings are fed as ``inputs_embeds``, scaled logits come from
scaled query weights, a dominant key is added to the layer-0 rows by hand.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import warnings
from collections import defaultdict

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from typer.testing import CliRunner

import ssacli
from ssacli import diagnose
from ssacli.attention.forward import SCORER_ATTR, observing
from ssacli.attention.interface import apply_scorer, attention_modules, scorers_of
from ssacli.cli import app
from ssacli.defaults import LOCAL_DISTANCE, SINK_K
from ssacli.diagnosis.metrics import METRICS
from ssacli.diagnosis.plan import icl_batches, pad_sequences, pick_targets
from ssacli.diagnosis.probe_kinds import PROBES, ActsOn, ProbeKind, Shift
from ssacli.diagnosis.recorder import Recorder
from ssacli.diagnosis.result import DiagnoseResult
from ssacli.diagnosis.texts import TEXTS
from ssacli.errors import EXIT_INPUT, EXIT_UNSUPPORTED, EXIT_USAGE, UnsupportedModelError, UsageError
from ssacli.models.icl_task import interleave, labels
from ssacli.models.loading import load_model
from tests.helpers.cli import run_main
from tests.helpers.models import FAMILIES, FIXTURES, VOCAB, build_model
from tests.helpers.naive import float32_kl_bound

TAU, TOP_K = 0.9, 5
LENGTHS = (9, 6, 4)  # one padded batch of three: right padding 0, 3 and 5
ROW_METRICS = [m for m in METRICS if m not in ("outlier_capture", "learned_sink")]  # no learned sinks here
SOFT_CLI = {"COLUMNS": "200"}


def sequences(lengths=LENGTHS, seed=3) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in lengths]


def right_pad(seqs) -> tuple[torch.Tensor, torch.Tensor]:
    """Written here, not with ssacli.diagnosis.plan.pad_sequences: ids padded with 0 and the mask."""
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for row, seq in enumerate(seqs):
        ids[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(seq)] = 1
    return ids, mask


def targets_of(seqs, batch_size: int, seed: int = 0) -> list[int]:
    """The target token diagnose picks for each sample (the probes' own seeded choice)."""
    batches = pad_sequences([list(s) for s in seqs], 0, batch_size)
    pick_targets(batches, seed)
    return torch.cat([b.target for b in batches]).tolist()


def visibility(mask: torch.Tensor, causal: bool, window: int | None = None) -> np.ndarray:
    """[b, q, k] bool: key j is a real token, and (causal) j <= i, and (window) i - j < window."""
    valid = mask.bool().numpy()
    t = valid.shape[1]
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    allowed = np.ones((t, t), dtype=bool)
    if causal:
        allowed &= j <= i
    if window is not None:
        allowed &= i - j < window
    return valid[:, None, :] & allowed[None]


def eager_maps(model, ids, mask, embeds=None) -> list[np.ndarray]:
    """Full attention maps [b, h, q, k] of every layer, from the model's own forward."""
    kwargs = {"attention_mask": mask, "output_attentions": True}
    with torch.no_grad():
        out = model(inputs_embeds=embeds, **kwargs) if embeds is not None else model(input_ids=ids, **kwargs)
    assert out.attentions and all(a is not None for a in out.attentions)
    return [a.double().numpy() for a in out.attentions]


def naive_metrics(maps, visible, valid, target=None, tau=TAU, top_k=TOP_K):
    """Every metric, [layer, head], from full maps, one query row at a time in plain Python.

    ``visible``: [b, q, k] bool, or a list with one per layer; ``valid``: [b, t] real tokens.
    Returns (metrics, rows per layer)."""
    layers, heads = len(maps), maps[0].shape[1]
    out = {name: np.full((layers, heads), np.nan) for name in METRICS}
    rows = np.zeros(layers, dtype=np.int64)
    valid = np.asarray(valid, dtype=bool)
    for layer, w in enumerate(maps):
        vis = visible[layer] if isinstance(visible, list) else visible
        b, h, t, _ = w.shape
        for head in range(h):
            acc, count, captured, capture_rows = defaultdict(float), 0, 0.0, 0
            for s in range(b):
                for i in range(t):
                    keys = [j for j in range(t) if vis[s, i, j]]
                    if not valid[s, i] or len(keys) < 2:
                        continue
                    row = [float(w[s, head, i, j]) for j in keys]
                    mass = sum(row)
                    if not mass > 0:
                        continue
                    p = [x / mass for x in row]
                    entropy = -sum(x * math.log(x) for x in p if x > 0)
                    acc["entropy"] += entropy / math.log(len(keys))
                    acc["max_weight"] += max(p)
                    acc["collapse_rate"] += float(max(p) >= tau)
                    acc["effective_tokens"] += math.exp(entropy)
                    acc["topk_mass"] += sum(sorted(p, reverse=True)[:top_k])
                    acc["sink_mass"] += p[0] if keys[0] == 0 else 0.0
                    acc["row_mass"] += mass
                    # the sink and position metrics (query i at key i: right padding keeps positions)
                    acc["sink_share"] += sum(x for x, j in zip(p, keys) if j < SINK_K)
                    acc["sink_uniform"] += sum(j < SINK_K for j in keys) / len(keys)
                    acc["local_share"] += sum(x for x, j in zip(p, keys) if abs(i - j) < LOCAL_DISTANCE)
                    acc["attention_distance"] += sum(x * abs(i - j) for x, j in zip(p, keys))
                    count += 1
                    if target is not None and target[s] in keys and i != target[s]:
                        captured += p[keys.index(target[s])]
                        capture_rows += 1
            for name in ROW_METRICS:
                out[name][layer, head] = acc[name] / count if count else np.nan
            out["sink_boost"][layer, head] = acc["sink_share"] / acc["sink_uniform"] if count else np.nan
            if capture_rows:
                out["outlier_capture"][layer, head] = captured / capture_rows
            rows[layer] = max(rows[layer], count)
    return out, rows


def check_level(result, probe: str, level: float, ref, *, layers=None, capture=False, atol=1e-5):
    """diagnose's metrics at one level equal the reference (optionally only some layers)."""
    found = result.probe(probe)
    li = found.levels.index(level)
    metrics, rows = ref
    keep = slice(None) if layers is None else layers
    names = ROW_METRICS + (["outlier_capture"] if capture else [])
    for name in names:
        got, want = found.metrics[name][li][keep], metrics[name][keep]
        assert np.allclose(got, want, atol=atol, rtol=0, equal_nan=False), (
            f"{probe}={level:g} {name}: diagnose {got} vs reference {want}"
        )
    assert found.rows[li][keep].tolist() == rows[keep].tolist()


def assert_same_results(a: DiagnoseResult, b: DiagnoseResult, atol=1e-6):
    assert [p.name for p in a.probes] == [p.name for p in b.probes]
    for pa, pb in zip(a.probes, b.probes):
        assert pa.levels == pb.levels and pa.note == pb.note
        np.testing.assert_array_equal(pa.rows, pb.rows, err_msg=pa.name)
        for name in METRICS:
            np.testing.assert_allclose(pa.metrics[name], pb.metrics[name], atol=atol, rtol=0, err_msg=name)
        assert pa.extras.keys() == pb.extras.keys()
        for key in pa.extras:
            # a KL of outputs from two float32 paths (padded or not) agrees to float32 resolution
            floor = float32_kl_bound(VOCAB) if key == "output_kl" else 0.0
            np.testing.assert_allclose(pa.extras[key], pb.extras[key], rtol=1e-5, atol=floor, err_msg=key)


def outputs(model, ids, mask):
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def is_eager_and_clean(model) -> bool:
    return (
        model.config._attn_implementation == "eager"
        and not hasattr(model.config, "ssacli_scorer")
        and not any(hasattr(m, SCORER_ATTR) for m in model.modules())
    )


# ---- streaming = full map = the eager path ----------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "gpt2", "bert"])
def test_streamed_blocks_equal_the_full_map_and_the_eager_reference(family):
    seqs = sequences()
    model, reference = build_model(family), build_model(family)
    probes = ["embed-scale:1,3", "outlier:1,20", "length"]
    small = diagnose(model, probes, inputs=seqs, batch_size=3, block_size=3)
    whole = diagnose(model, probes, inputs=seqs, batch_size=3, block_size=10_000)
    assert small.route == whole.route == "ssacli" and small.settings["block_size"] == 3
    assert_same_results(small, whole)
    assert small.probe("length").skipped and "explicit inputs" in small.probe("length").note

    causal = FAMILIES[family]["kind"] == "causal"
    ids, mask = right_pad(seqs)
    visible, valid = visibility(mask, causal), mask.bool().numpy()
    target = targets_of(seqs, 3)
    base = reference.get_input_embeddings()(ids).detach()
    plain = naive_metrics(eager_maps(reference, ids, mask), visible, valid, target)
    check_level(small, "embed-scale", 1, plain)
    check_level(small, "outlier", 1, plain, capture=True)  # capture at σ = 1: the eager maps' own
    scaled = eager_maps(reference, ids, mask, embeds=3 * base)
    check_level(small, "embed-scale", 3, naive_metrics(scaled, visible, valid))
    planted = base.clone()
    planted[torch.arange(len(seqs)), target] *= 20
    planted_maps = eager_maps(reference, ids, mask, planted)
    check_level(small, "outlier", 20, naive_metrics(planted_maps, visible, valid, target), capture=True)
    expected_rows = sum(len(s) - 1 if causal else len(s) for s in seqs)
    assert small.probe("embed-scale").rows.tolist() == [[expected_rows] * 2] * 2


def test_identity_levels_of_every_probe_are_the_unprobed_model():
    """embed-scale 1, outlier 1, logit-scale 1 and dominant-key 0 all measure the model as it is."""
    seqs = sequences()
    result = diagnose(
        build_model("gpt2"), ["embed-scale:1", "outlier:1", "logit-scale:1", "dominant-key:0"], inputs=seqs
    )
    ids, mask = right_pad(seqs)
    ref = naive_metrics(eager_maps(build_model("gpt2"), ids, mask), visibility(mask, True), mask.bool())
    for name in ("embed-scale", "outlier", "logit-scale", "dominant-key"):
        check_level(result, name, result.probe(name).levels[0], ref)
    losses = {p.extras["loss"][0] for p in result.probes}
    assert len(losses) == 1 and math.isfinite(losses.pop())


def test_the_lm_loss_is_the_models_own_loss_in_pieces_of_any_size(monkeypatch):
    """diagnose's LM loss (computed a few positions at a time, so that no float32 copy of every
    logit exists at long lengths) equals the model's own mean next-token loss, whatever the piece."""
    import ssacli.diagnosis.forward as diagnose_forward

    model = build_model("gpt2")
    ids = torch.randint(3, 100, (2, 23), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = float(model(input_ids=ids, labels=ids).loss)
    for piece in (3, 22, 4096):
        monkeypatch.setattr(diagnose_forward, "LOSS_CHUNK", piece)
        (loss,) = diagnose(model, ["embed-scale:1"], inputs=ids.tolist()).probes[0].extras["loss"]
        assert loss == pytest.approx(expected, rel=1e-5)


# ---- padding -----------------------------------------------------------------------------------------


class FakeTokenizer:
    """Just what diagnose reads from a tokenizer when inputs are given: padding side and pad id."""

    def __init__(self, padding_side: str) -> None:
        self.padding_side = padding_side
        self.pad_token_id = 0


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("family", ["llama", "gpt2", "bert"])
def test_a_padded_batch_equals_its_samples_one_by_one(family, side):
    """Padding is invisible in every metric and in the loss, whatever side the tokenizer pads on
    (left padding would move gpt2's and bert's absolute positions and put padding at the sink)."""
    seqs = sequences()
    model = build_model(family)
    probes = ["embed-scale:1,3", "outlier:1,20", "dominant-key:6"]
    tokenizer = FakeTokenizer(side)
    batched = diagnose(model, probes, inputs=seqs, batch_size=3, tokenizer=tokenizer)
    single = diagnose(model, probes, inputs=seqs, batch_size=1, tokenizer=tokenizer)
    assert_same_results(batched, single, atol=1e-5)
    causal = FAMILIES[family]["kind"] == "causal"
    assert batched.probe("outlier").rows[0, 0] == sum(len(s) - causal for s in seqs)


def _recorder_means(model, seqs, batch_size, side):
    layers = list(attention_modules(model))
    recorder = Recorder(
        {id(m): i for i, (_, m) in enumerate(layers)}, tau=TAU, top_k=TOP_K, block_size=4, causal=True
    )
    for batch in pad_sequences(seqs, 0, batch_size, side=side):
        recorder.valid, recorder.target = batch.valid, None
        with torch.no_grad(), observing(recorder):
            model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    return [recorder.stats[i].means() for i in range(len(layers))]


def test_recorder_on_left_padded_batches_matches_one_by_one():
    """Left padding through the Recorder (RoPE model: positions do not matter) counts the same rows
    with the same shape metrics as the samples alone. (Not sink_mass: it is defined as the weight on
    key 0, which is padding in a left-padded row; diagnose itself always pads on the right.)"""
    model = apply_scorer(build_model("llama"), "softmax")
    seqs = sequences()
    batched = _recorder_means(model, seqs, 3, "left")
    single = _recorder_means(model, seqs, 1, "left")
    for layer_b, layer_s in zip(batched, single):
        for name in ("entropy", "max_weight", "collapse_rate", "effective_tokens", "topk_mass", "row_mass"):
            np.testing.assert_allclose(layer_b[name], layer_s[name], atol=1e-5, err_msg=name)


def test_targets_are_seeded_real_tokens_of_the_first_half():
    seqs = sequences((9, 6, 4, 2))
    batches = pad_sequences(seqs, 0, 4, side="left")
    pick_targets(batches, 5)
    again = pad_sequences(seqs, 0, 4, side="left")
    pick_targets(again, 5)
    assert torch.equal(batches[0].target, again[0].target)
    for row, seq in enumerate(seqs):
        start = 9 - len(seq)  # left padding: the first real token
        offset = batches[0].target[row].item() - start
        assert 1 <= offset <= max(1, (len(seq) + 1) // 2 - 1), (row, offset)


# ---- probes do what they say --------------------------------------------------------------------------


def test_logit_scale_is_temperature_one_over_alpha_and_scaled_queries():
    seqs = sequences()
    model = build_model("llama")
    ids, mask = right_pad(seqs)
    before = outputs(model, ids, mask)
    scaled = diagnose(model, ["logit-scale:1,4"], inputs=seqs)
    tempered = diagnose(model, ["logit-scale:1"], scorer="temperature:t=0.25", inputs=seqs)
    assert tempered.scorer == "temperature:t=0.25" and scaled.scorer == "softmax"
    assert is_eager_and_clean(model) and torch.equal(outputs(model, ids, mask), before)
    a, b = scaled.probe("logit-scale"), tempered.probe("logit-scale")
    for name in METRICS:
        np.testing.assert_allclose(a.metrics[name][1], b.metrics[name][0], atol=1e-5, err_msg=name)
    assert a.extras["loss"][1] == pytest.approx(b.extras["loss"][0], rel=1e-5)
    assert a.extras["loss"][1] != pytest.approx(a.extras["loss"][0], rel=1e-6)  # α really acted
    # Independent: llama's q_proj has no bias and RoPE is linear, so q_proj × 4 scales every logit × 4.
    reference = build_model("llama")
    with torch.no_grad():
        for layer in reference.model.layers:
            layer.self_attn.q_proj.weight.mul_(4.0)
    maps = eager_maps(reference, ids, mask)
    check_level(scaled, "logit-scale", 4, naive_metrics(maps, visibility(mask, True), mask.bool()))


def test_dominant_key_drives_capture_to_one_and_matches_layer_zero_by_hand():
    seqs = sequences()
    levels = [0, 1, 2, 4, 8, 40]
    result = diagnose(build_model("llama"), [f"dominant-key:{','.join(map(str, levels))}"], inputs=seqs)
    capture = result.probe("dominant-key").metrics["outlier_capture"]  # [level, layer, head]
    assert np.all(np.diff(capture.mean(axis=2), axis=0) > 0), capture.mean(axis=2)
    assert capture[-1].min() > 0.99
    # Layer 0 sees unchanged inputs, so its rows are the eager rows with e^M on the target key.
    ids, mask = right_pad(seqs)
    target = targets_of(seqs, 8)
    w = eager_maps(build_model("llama"), ids, mask)[0]
    visible = visibility(mask, True)
    for level in levels:
        factor = np.ones_like(w)
        for s, t in enumerate(target):
            factor[s, :, :, t] = math.exp(level)
        bumped = w * factor
        bumped /= bumped.sum(-1, keepdims=True)
        ref = naive_metrics([bumped], visible, mask.bool(), target)
        check_level(result, "dominant-key", level, ref, layers=slice(0, 1), capture=True)


def test_probes_act_where_their_kind_says_not_by_name(monkeypatch):
    """A kind under a new name that declares the logits as its place and scaling as its effect is
    logit-scale: the forward pass and the input plan read the declaration, never the name."""
    seqs = sequences()
    model = build_model("llama")
    twin = ProbeKind("logit-twin", (1, 4), "α", "attention logits × α", ActsOn.LOGITS, Shift.SCALE, neutral=1)
    monkeypatch.setitem(PROBES, twin.name, twin)
    a = diagnose(model, ["logit-scale:1,4"], inputs=seqs).probe("logit-scale")
    b = diagnose(model, ["logit-twin:1,4"], inputs=seqs).probe("logit-twin")
    assert a.extras["loss"] == b.extras["loss"] and a.extras["loss"][0] != a.extras["loss"][1]
    for name in METRICS:
        np.testing.assert_array_equal(a.metrics[name], b.metrics[name], err_msg=name)


# ---- eager fallback --------------------------------------------------------------------------------


def _off_registry(family: str):
    kwargs = {
        "gpt_neo": dict(
            num_layers=2,
            attention_types=[[["global", "local"], 1]],
            hidden_size=32,
            num_heads=4,
            window_size=8,
            max_position_embeddings=128,
        ),
        "bloom": dict(n_layer=2, hidden_size=32, n_head=4),
    }[family]
    special = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    config = AutoConfig.for_model(family, vocab_size=VOCAB, **special, **kwargs)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()


@pytest.mark.parametrize("family", ["gpt_neo", "bloom"])
def test_eager_fallback_matches_full_maps_and_keeps_no_map(family):
    seqs = sequences((12, 9, 5))  # longer than gpt_neo's local window of 8
    model, reference = _off_registry(family), _off_registry(family)
    ids, mask = right_pad(seqs)
    before = outputs(model, ids, mask)
    returned = []
    model.register_forward_hook(lambda module, args, out: returned.append(out.attentions))
    result = diagnose(
        model,
        ["embed-scale:1,3", "outlier:1,20", "logit-scale:1,2", "dominant-key:0,4"],
        inputs=seqs,
        batch_size=2,
    )
    assert result.route == "eager-fallback" and result.heads == [4, 4]
    for name in ("logit-scale", "dominant-key"):
        probe = result.probe(name)
        assert probe.skipped and "eager fallback" in probe.note and not probe.rows.any()
    # every forward (2 probes x 2 levels x 2 batches) handed back no attention map
    assert len(returned) == 8 and all(a is None for out in returned for a in out)
    assert torch.equal(outputs(model, ids, mask), before)
    assert not any(m._forward_hooks for m in model.transformer.h.modules())

    windows = [None, 8] if family == "gpt_neo" else [None, None]  # gpt_neo: global, then local
    visible = [visibility(mask, True, w) for w in windows]
    valid, target = mask.bool().numpy(), targets_of(seqs, 2)
    base = reference.get_input_embeddings()(ids).detach()
    plain = eager_maps(reference, ids, mask)
    check_level(result, "embed-scale", 1, naive_metrics(plain, visible, valid))
    check_level(result, "outlier", 1, naive_metrics(plain, visible, valid, target), capture=True)
    check_level(
        result, "embed-scale", 3, naive_metrics(eager_maps(reference, ids, mask, 3 * base), visible, valid)
    )
    planted = base.clone()
    planted[torch.arange(len(seqs)), target] *= 20
    planted_maps = eager_maps(reference, ids, mask, planted)
    check_level(result, "outlier", 20, naive_metrics(planted_maps, visible, valid, target), capture=True)
    if family == "gpt_neo":  # the window matters here: a causal-only N_i would give other numbers
        causal_only = naive_metrics(plain, visibility(mask, True), valid)[0]["entropy"][1]
        assert np.abs(causal_only - result.probe("embed-scale").metrics["entropy"][0, 1]).max() > 1e-3
    with pytest.raises(UnsupportedModelError, match=family):
        diagnose(model, ["embed-scale:1"], scorer="ssa", inputs=seqs)


# ---- a real folder with a tokenizer: the numeric probe -----------------------------------------------


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    trainer = trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]"])
    tok.train_from_iterator([*TEXTS, "0 1 2 3 4 5 6 7 8 9"], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")


def test_saved_folder_with_tokenizer_runs_every_probe_and_numeric_grows_with_digits(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = _tokenizer()
    tokenizer.save_pretrained(tmp_path)
    torch.manual_seed(0)
    special = dict(pad_token_id=tokenizer.pad_token_id, bos_token_id=None, eos_token_id=None)
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=4, n_positions=64, **special)
    GPT2LMHeadModel(config).save_pretrained(tmp_path)
    samples = 2
    result = diagnose(str(tmp_path), samples=samples, length=24)  # every probe, default levels
    assert result.route == "ssacli" and result.family == "gpt2"
    assert result.settings["inputs"] == "built-in texts"
    assert [p.name for p in result.probes] == [p.name for p in ssacli.diagnosis.probe_kinds.default_probes()]
    for probe in result.probes:
        assert not probe.skipped, probe.name
        losses = probe.extras["loss"]
        assert len(losses) == len(probe.levels) and all(math.isfinite(v) for v in losses), probe.name
    numeric = result.probe("numeric")
    assert numeric.levels == [float(d) for d in range(2, 10)] and numeric.note is None
    # One token per digit: each extra digit adds one token per number in the sample's template
    # (every template holds the number two or three times), the same for every level.
    grow = np.diff(numeric.rows[:, 0])
    assert len(set(grow.tolist())) == 1 and 2 * samples <= grow[0] <= 3 * samples, numeric.rows[:, 0]
    # Default length levels double the base up to the model's 64 positions: 24, 48 tokens; level m
    # runs ceil(samples / m) sequences (about the same tokens per level).
    length = result.probe("length")
    assert length.levels == [1.0, 2.0] and length.extras["tokens"] == [24.0, 48.0]
    assert length.rows[:, 0].tolist() == [samples * 23, 1 * 47] and length.note is None
    assert result.probe("embed-scale").rows[:, 0].tolist() == [samples * 23] * 6


def test_length_probe_rows_without_a_cap():
    result = diagnose(build_model("bert"), ["length:1,2,3"], samples=2, length=6)  # random ids, no tokenizer
    assert result.settings["inputs"] == "random token ids"
    # level m runs ceil(2 / m) sequences of 6·m tokens, every row counted
    assert result.probe("length").rows[:, 0].tolist() == [12, 12, 18] and result.probe("length").note is None


# ---- every supported family -------------------------------------------------------------------------


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_diagnoses_and_is_restored(family, padded_batch):
    model = build_model(family)
    ids, mask = padded_batch
    kind = FAMILIES[family]["kind"]
    extra = {"decoder_input_ids": ids[:, :4]} if kind == "seq2seq" else {}
    with torch.no_grad():
        before = model(input_ids=ids, attention_mask=mask, **extra)
    keys = list(model.state_dict())
    samples, length = 2, 10
    result = diagnose(model, ["embed-scale:1,8"], samples=samples, length=length)
    assert result.route == "ssacli" and result.family == family and result.scorer == "softmax"
    probe = result.probe("embed-scale")
    entropy, collapse = probe.metrics["entropy"], probe.metrics["collapse_rate"]
    for li, heads in enumerate(result.heads):
        assert np.isfinite(entropy[0, li, :heads]).all(), (li, entropy[0, li])
    finite = np.isfinite(entropy)
    assert ((entropy[finite] >= -1e-9) & (entropy[finite] <= 1 + 1e-6)).all()
    assert ((collapse[finite] >= 0) & (collapse[finite] <= 1)).all()
    assert (probe.rows > 0).all()
    if kind != "seq2seq":  # decoder and cross attention of seq2seq count differently
        assert (probe.rows == samples * (length - (kind == "causal"))).all()
    assert is_eager_and_clean(model) and list(model.state_dict()) == keys
    with torch.no_grad():
        after = model(input_ids=ids, attention_mask=mask, **extra)
    field = "logits" if kind != "encoder" else "last_hidden_state"
    assert torch.equal(getattr(before, field), getattr(after, field))


def attention_state(model) -> tuple:
    """What diagnose may touch: each module's scorer (the object and its values), the configured
    implementation and the config's spec (ABSENT when it has none)."""
    scorers = {
        n: (s, {k: v.clone() for k, v in s.state_dict().items()}) for n, s in scorers_of(model).items()
    }
    return scorers, model.config._attn_implementation, getattr(model.config, "ssacli_scorer", ABSENT)


ABSENT = object()
CONVERTED_LLAMA = FIXTURES / "previous-release/converted-llama-ssa"


@pytest.mark.parametrize("start", ["plain", "folder-config", "applied", "converted"])
def test_diagnose_with_a_scorer_puts_back_the_attention_state_it_found(start, padded_batch):
    """A model with scorers keeps those very objects and values; a plain one goes back to eager; a
    model whose config names a spec (loaded from a converted folder by transformers) keeps the spec."""
    if start == "folder-config":
        model = AutoModelForCausalLM.from_pretrained(CONVERTED_LLAMA, attn_implementation="eager").eval()
    else:
        model = build_model("llama", initializer_range=0.2)
    if start == "applied":
        apply_scorer(model, "ssmax:s=2")
    elif start == "converted":
        ssacli.convert(model, "ssa:init=faithful,m=64", samples=2, length=8)
    ids, mask = padded_batch
    ids = ids % model.config.vocab_size
    before, logits = attention_state(model), outputs(model, ids, mask)
    assert bool(before[0]) == (start in ("applied", "converted"))
    diagnose(model, ["embed-scale:1,4"], scorer="ssa:init=paper", samples=2, length=8)
    scorers, implementation, spec = attention_state(model)
    assert (implementation, spec) == before[1:]
    assert scorers.keys() == before[0].keys()
    for name, (scorer, values) in scorers.items():
        assert scorer is before[0][name][0]
        assert values.keys() == before[0][name][1].keys()
        assert all(torch.equal(values[k], before[0][name][1][k]) for k in values)
    assert torch.equal(outputs(model, ids, mask), logits)


# ---- bundled ICL models --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["every-softmax", "every-ssa"])
def test_bundled_icl_models(name):
    samples, points = 4, 10
    done = []
    result = diagnose(
        f"builtin:{name}",
        ["outlier:1,1000", "numeric"],
        samples=samples,
        length=points,
        batch_size=2,
        progress=lambda what, i, total: done.append((i, total)),
    )
    assert result.family == "icl-gpt2" and result.route == "ssacli"
    assert result.scorer == ("softmax" if name.endswith("softmax") else "ssa:init=paper")
    assert result.settings["length_unit"] == "points"
    assert done[-1] == (4, 4)  # 2 levels x 2 batches; numeric runs nothing
    numeric = result.probe("numeric")
    assert numeric.skipped and numeric.note == "not for ICL models" and not numeric.extras
    outlier = result.probe("outlier")
    assert len(outlier.extras["error"]) == 2 and all(0 <= e <= 1 for e in outlier.extras["error"])
    assert (outlier.rows == samples * (2 * points - 1)).all()
    # Reference: the model's full maps on the same prompts (softmax: the eager GPT-2 path).
    icl = load_model(f"builtin:{name}").model
    if name.endswith("softmax"):
        ssacli.restore(icl.backbone)
        icl.backbone.set_attn_implementation("eager")
    batches = icl_batches(icl.spec.task, samples, points, 2, 0)
    pick_targets(batches, 0)
    target = torch.cat([b.target for b in batches]).tolist()
    assert all(t % 2 == 0 for t in target)  # x tokens
    visible = visibility(torch.ones(samples, 2 * points), True)
    valid = np.ones((samples, 2 * points), dtype=bool)
    for level in (1, 1000):
        maps = []
        for batch in batches:
            xs = batch.xs.clone()
            xs[torch.arange(xs.shape[0]), batch.target // 2] *= level
            with torch.no_grad():
                maps.append(icl.attention_maps(interleave(xs, labels(icl.spec.task, xs, batch.coef))))
        full = [torch.cat(per_layer).double().numpy() for per_layer in zip(*maps)]
        check_level(result, "outlier", level, naive_metrics(full, visible, valid, target), capture=True)


# ---- JSON ---------------------------------------------------------------------------------------------


def test_when_every_probe_is_skipped_the_one_line_says_why_each_was(monkeypatch, capsys):
    """Nothing measured is a usage error (exit 2) whose one line names each probe's reason, not only
    that no heatmap can be drawn."""
    args = ["diagnose", "builtin:every-softmax", "--probe", "numeric:2", "--samples", "2"]
    code, _, err = run_main(args, monkeypatch, capsys)
    assert code == EXIT_USAGE
    assert err.count("\n") == 1 and "every probe was skipped (numeric: not for ICL models)" in err


def test_a_text_for_an_icl_model_is_refused_not_ignored():
    """An ICL model is probed with its task's prompts: a text would be silently unused."""
    with pytest.raises(UsageError, match="--text has no effect on 'builtin:every-softmax'"):
        diagnose("builtin:every-softmax", ["outlier:1,10"], samples=2, text="some text of mine. " * 20)


def test_a_result_with_a_field_missing_or_malformed_is_an_input_error_naming_it():
    """from_dict is public: an edited or cut-short result is an InputError that names what is wrong
    (it was a bare KeyError for a missing field)."""
    from ssacli.errors import InputError

    good = diagnose(build_model("gpt2"), ["embed-scale:1"], samples=1, length=8).to_dict()
    missing = {k: v for k, v in good.items() if k != "layers"}
    with pytest.raises(InputError, match="'layers'"):
        DiagnoseResult.from_dict(missing)
    no_levels = json.loads(json.dumps(good))
    del no_levels["probes"][0]["levels"]
    with pytest.raises(InputError, match="'levels'"):
        DiagnoseResult.from_dict(no_levels)
    wrong_type = {**good, "heads": 7}
    with pytest.raises(InputError, match="malformed"):
        DiagnoseResult.from_dict(wrong_type)


def test_json_round_trip_of_a_real_result(tmp_path):
    result = diagnose(build_model("gpt2"), ["outlier:1,50", "numeric:2"], samples=2, length=8)
    assert result.probe("numeric").skipped  # NaN everywhere: written as null, read back as NaN
    text = json.dumps(result.to_dict(), allow_nan=False)
    back = DiagnoseResult.from_dict(json.loads(text))
    for a, b in zip(result.probes, back.probes):
        assert (a.name, a.levels, a.note, a.extras) == (b.name, b.levels, b.note, b.extras)
        np.testing.assert_array_equal(a.rows, b.rows)
        assert b.rows.dtype == np.int64
        for name in METRICS:
            np.testing.assert_array_equal(a.metrics[name], b.metrics[name])  # NaN == NaN here
    assert (back.layers, back.heads, back.route, back.settings) == (
        result.layers,
        result.heads,
        result.route,
        result.settings,
    )
    path = tmp_path / "r.json"
    path.write_text(result.to_json())
    loaded = DiagnoseResult.load(path)
    for name in METRICS:
        np.testing.assert_array_equal(
            loaded.probe("outlier").metrics[name], result.probe("outlier").metrics[name]
        )
    json.dumps(ssacli.compare_results(result, loaded), allow_nan=False)


# ---- API validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"samples": 0},
        {"batch_size": 0},
        {"block_size": 0},
        {"tau": 0.0},
        {"tau": 1.5},
        {"top_k": 0},
        {"probes": ["outlier:1", "outlier:10"]},
        {"probes": ["nope"]},
        {"probes": ["numeric:2.5"]},
    ],
)
def test_bad_arguments_are_usage_errors(kwargs):
    with pytest.raises(UsageError):
        diagnose(build_model("llama"), **{"probes": ["outlier:1"], **kwargs})


# ---- the command line ---------------------------------------------------------------------------------

runner = CliRunner()
CLI_PROBES = ["--probe", "outlier:1,100", "--probe", "embed-scale:1,4", "--samples", "2", "--length", "8"]
API_SETTINGS = dict(probes=["outlier:1,100", "embed-scale:1,4"], samples=2, length=8)


def test_cli_writes_json_and_html(tmp_path):
    out, page = tmp_path / "r.json", tmp_path / "r.html"
    args = [
        "diagnose",
        "builtin:every-softmax",
        "--quiet",
        *CLI_PROBES,
        "--json",
        str(out),
        "--html",
        str(page),
    ]
    result = runner.invoke(app, args, env=SOFT_CLI)
    assert result.exit_code == 0, result.output
    assert [line for line in result.output.splitlines() if line.strip()] == [f"wrote {out}", f"wrote {page}"]
    loaded = DiagnoseResult.load(out)
    direct = diagnose("builtin:every-softmax", **API_SETTINGS)
    assert [p.name for p in loaded.probes] == ["outlier", "embed-scale"]
    assert_same_results(loaded, direct, atol=1e-12)
    assert "<img" in page.read_text()


def test_cli_compare_deltas_are_b_minus_a(tmp_path):
    out = tmp_path / "cmp.json"
    args = ["diagnose", "builtin:every-softmax", "--quiet", *CLI_PROBES, "--compare", "builtin:every-ssa"]
    result = runner.invoke(app, [*args, "--json", str(out)], env=SOFT_CLI)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    a = diagnose("builtin:every-softmax", **API_SETTINGS)
    b = diagnose("builtin:every-ssa", **API_SETTINGS)
    assert set(data["deltas"]) == {"outlier", "embed-scale"}
    for probe in ("outlier", "embed-scale"):
        entry = data["deltas"][probe]
        assert entry["levels"] == a.probe(probe).levels
        for name in METRICS:
            with np.errstate(invalid="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # nanmean of an undefined metric
                means = [np.nanmean(r.probe(probe).metrics[name].reshape(2, -1), axis=1) for r in (a, b)]
            expected = (means[1] - means[0]).tolist()
            got = entry[name]
            assert [v is None for v in got] == [math.isnan(v) for v in expected], (probe, name)
            finite = [v for v in expected if not math.isnan(v)]
            assert [v for v in got if v is not None] == pytest.approx(finite, abs=1e-9), (probe, name)
    # Only probes with a target token define outlier capture.
    assert all(v is None for v in data["deltas"]["embed-scale"]["outlier_capture"])
    assert all(v is not None for v in data["deltas"]["outlier"]["outlier_capture"])
    assert data["a"]["scorer"] == "softmax" and data["b"]["scorer"] == "ssa:init=paper"


def _bad_inputs(tmp_path):
    (tmp_path / "empty-dir").mkdir()
    (tmp_path / "empty.txt").write_text("  \n")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 cr\xe8me".encode("latin-1"))
    ok = ["builtin:every-softmax", "--probe", "outlier:1", "--samples", "1", "--length", "4"]
    lm = ["builtin:wikitext-softmax", *ok[1:]]  # --text is for language models (an ICL model refuses it)
    cases = [
        (["--probe", "nope"], EXIT_USAGE, "unknown probe"),
        (["--probe", "outlier:-1"], EXIT_USAGE, "must be finite and > 0"),
        (["--probe", "outlier:abc"], EXIT_USAGE, "not a number"),
        (["--probe", "outlier:nan"], EXIT_USAGE, "finite"),
        (["--probe", "outlier:inf"], EXIT_USAGE, "finite"),
        (["--probe", "embed-scale:0"], EXIT_USAGE, "> 0"),
        (["--probe", "numeric:2.5"], EXIT_USAGE, "whole number"),
        ([str(tmp_path / "nowhere"), "--probe", "outlier:1"], EXIT_INPUT, "does not exist"),
        ([str(tmp_path / "empty-dir"), "--probe", "outlier:1"], EXIT_INPUT, "config.json"),
        ([*lm, "--text", str(tmp_path / "missing.txt")], EXIT_INPUT, "does not exist"),
        ([*lm, "--text", str(tmp_path / "empty.txt")], EXIT_INPUT, "empty"),
        ([*lm, "--text", str(tmp_path / "latin1.txt")], EXIT_INPUT, "UTF-8"),
        ([*lm, "--text", str(tmp_path / "empty-dir")], EXIT_INPUT, "folder"),
        ([*ok, "--text", str(tmp_path / "latin1.txt")], EXIT_USAGE, "--text has no effect"),
        ([*ok, "--heatmap", "bogus"], EXIT_USAGE, "bogus"),
        ([*ok, "--heatmap", "max_weight@length"], EXIT_USAGE, "length"),
        ([*ok, "--scorer", "ssa:bogus=1"], EXIT_USAGE, "bogus"),
        ([*ok, "--device", "tpu"], EXIT_USAGE, "tpu"),
        ([*ok, "--dtype", "float8"], EXIT_USAGE, "float8"),
        ([*ok, "--tau", "0"], EXIT_USAGE, "tau"),
        ([*ok, "--compare", str(tmp_path / "nowhere")], EXIT_INPUT, "does not exist"),  # fails after run 1
        (["builtin:nope", "--probe", "outlier:1"], EXIT_USAGE, "builtin:every-softmax"),
    ]
    if not torch.cuda.is_available():
        cases.append(([*ok, "--device", "cuda"], EXIT_USAGE, "CUDA"))
    return cases


def test_cli_errors_are_one_line_with_the_documented_code_and_leave_no_file(tmp_path, monkeypatch, capsys):
    for args, code, words in _bad_inputs(tmp_path):
        out = tmp_path / "out.json"
        argv = ["diagnose", *args, "--quiet", "--json", str(out)]
        exit_code, stdout, stderr = run_main(argv, monkeypatch, capsys)
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert exit_code == code, (args, stderr)
        assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], (args, stderr)
        assert "Traceback" not in stderr and stdout == "", args
        assert not out.exists() and not list(tmp_path.glob(".out.json*")), args


def test_cli_error_from_a_real_shell(tmp_path):
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, "-m", "ssacli", "diagnose", str(tmp_path / "nowhere"), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == EXIT_INPUT, proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.strip()]) == 1
    assert "Traceback" not in proc.stderr and not out.exists()


def test_cli_off_registry_scorer_is_exit_3(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "neo"
    _off_registry("gpt_neo").save_pretrained(folder)
    args = ["diagnose", str(folder), "--scorer", "ssa", "--probe", "outlier:1", "--quiet", "--random"]
    exit_code, _, stderr = run_main(args, monkeypatch, capsys)
    assert exit_code == EXIT_UNSUPPORTED and "gpt_neo" in stderr and "Traceback" not in stderr


def test_inputs_longer_than_the_model_are_capped_not_crashing():
    config = AutoConfig.for_model("gpt2", vocab_size=VOCAB, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    probes = ["embed-scale:1", "length:1", "outlier:1"]
    result = diagnose(model, probes, samples=2, length=40, random_ids=True)
    # the base length itself is capped, and the result says what was asked (the summary's one line)
    assert result.settings["length"] == 16 and result.settings["length_asked"] == 40
    with pytest.raises(UsageError, match="at most 16; give levels up to ×1"):  # ×2 of 16 would be capped
        diagnose(model, ["length:1,2"], samples=2, length=40, random_ids=True)
    for probe in result.probes:
        # Causal rows that see >= 2 keys: 15 of 16 per sequence.
        assert probe.rows[:, 0].tolist() == [2 * 15] * len(probe.levels), probe.name
        assert np.isfinite(probe.metrics["outlier_capture"]).any() == (probe.name == "outlier")
    explicit = diagnose(model, ["embed-scale:1"], inputs=[list(range(3, 30))])
    assert explicit.probes[0].note == "inputs truncated to the model's 16 positions"
    assert explicit.probes[0].rows[0, 0] == 15


def test_a_converted_folder_loaded_by_plain_transformers_is_refused_with_the_fix(tmp_path):
    """Its config names ssa:init=faithful (m chosen per layer), which plain transformers does not
    load: diagnose says to diagnose the folder, instead of measuring a placeholder m."""
    from transformers import AutoModelForCausalLM

    from ssacli.conversion import convert

    out = tmp_path / "faithful"
    convert(build_model("llama"), "ssa:init=faithful", out)
    plain = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    with pytest.raises(UsageError, match="diagnose the folder itself"):
        diagnose(plain, ["logit-scale:1"], inputs=[list(range(3, 19))])
    folder = diagnose(str(out), ["logit-scale:1"], inputs=[list(range(3, 19))])  # the fix it names
    assert folder.scorer.startswith("ssa:init=faithful")
