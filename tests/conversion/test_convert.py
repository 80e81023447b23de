"""ssacli.convert: faithful-init fidelity, the saved folder's round trip, and refusals."""

from __future__ import annotations

import json

import pytest
import torch
from torch.nn import functional as F
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM

import ssacli
import ssacli.transformers  # noqa: F401 (plain transformers loads converted folders: the round trip)
from ssacli.conversion import convert, save_model
from ssacli.conversion.calibration import fidelity
from ssacli.errors import InputError, UnsupportedModelError, UsageError
from ssacli.models.checkpoint import META_FILE, MODEL_FORMAT, SCORER_FILE
from ssacli.models.guard import attention_layout, guarded_type
from ssacli.models.kinds import kind_of, max_positions
from ssacli.models.loading import LoadedModel
from tests.helpers.cli import run_main
from tests.helpers.models import FAMILIES, VOCAB, build_model
from tests.helpers.naive import float32_kl_resolution

AUTO = {"causal": AutoModelForCausalLM, "encoder": AutoModel, "seq2seq": AutoModelForSeq2SeqLM}
KL_LIMIT = 1e-3  # nats per token, the bar for init=faithful


def loaded_of(model) -> LoadedModel:
    return LoadedModel(model, model.config.model_type, model.config.model_type, kind_of(model), None,
                       max_positions(model.config))  # fmt: skip


def wide_model(family: str):
    """Tiny models with 10x the default init spread, so attention logits are far from zero and the
    faithful approximation is actually exercised (T5's own init already gives large logits)."""
    return build_model(family) if family == "t5" else build_model(family, initializer_range=0.2)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_faithful_init_stays_close_to_softmax(family):
    _, report = convert(loaded_of(wide_model(family)), "ssa:init=faithful", samples=4, length=32)
    _, closer = convert(loaded_of(wide_model(family)), "ssa:init=faithful,m=1024", samples=4, length=32)
    assert report["from"] == "softmax" and report["to"] == "ssa:init=faithful"
    if "kl_per_token" in report:  # language models
        assert 0 <= report["kl_per_token"] < KL_LIMIT
        assert report["top1_agreement"] > 0.9  # random models have near-ties at the top
        assert closer["kl_per_token"] < report["kl_per_token"]  # larger m: closer to softmax
    else:  # encoders: relative error of the hidden states
        assert report["relative_error"] < 1e-2
        assert closer["relative_error"] < report["relative_error"]


@pytest.mark.parametrize("name", ["every-softmax", "every-ssa"])
def test_faithful_init_on_the_bundled_sign_models(name):
    _, report = convert(f"builtin:{name}", "ssa:init=faithful")
    assert 0 <= report["kl_per_token"] < KL_LIMIT and report["top1_agreement"] > 0.99


def test_fidelity_numbers_by_hand():
    before = [torch.tensor([[[0.0, 1.0], [2.0, 0.0]]])]
    after = [torch.tensor([[[1.0, 0.0], [2.0, 0.0]]])]
    report = fidelity("causal", before, after, [])
    p = F.softmax(before[0][0, 0].double(), -1)
    q = F.softmax(after[0][0, 0].double(), -1)
    expected_kl = float((p * (p / q).log()).sum()) / 2  # the second token is unchanged
    assert report["kl_per_token"] == pytest.approx(expected_kl, rel=1e-9)
    assert report["top1_agreement"] == 0.5 and report["tokens"] == 2
    hidden = fidelity("encoder", [torch.tensor([[3.0, 4.0]])], [torch.tensor([[3.0, 4.5]])], [])
    assert hidden["relative_error"] == pytest.approx(0.5 / 5.0)


def test_a_poor_scorer_is_reported_as_far():
    """Fidelity must see a real change: sparsemax is not close to softmax on the same model."""
    _, report = convert(loaded_of(wide_model("gpt2")), "sparsemax", samples=4, length=32)
    assert report["kl_per_token"] > 10 * KL_LIMIT


@pytest.mark.parametrize("family", ["llama", "gpt2", "bert", "t5"])
def test_save_load_round_trip_and_plain_transformers(tmp_path, family):
    model = build_model(family)
    loaded, _ = convert(loaded_of(model), "ssa:init=paper,learn=all", samples=2, length=16)
    with torch.no_grad():  # make the scorer parameters distinctive, so a lost load would show
        for scorer in ssacli.scorers_of(model).values():
            scorer.b_raw.add_(torch.linspace(-0.5, 0.5, scorer.b_raw.numel()))
            scorer.n_raw.add_(torch.linspace(0.3, -0.3, scorer.n_raw.numel()))
    out = save_model(loaded, tmp_path / "converted", meta={"source": family})
    meta = json.loads((out / META_FILE).read_text())
    assert meta["format"] == MODEL_FORMAT and meta["scorer"] == "ssa:init=paper,learn=all"
    assert (out / SCORER_FILE).is_file()

    ids = torch.randint(3, VOCAB, (2, 11), generator=torch.Generator().manual_seed(0))
    kwargs = {"decoder_input_ids": ids} if FAMILIES[family]["kind"] == "seq2seq" else {}
    reloaded = ssacli.load(str(out))
    with torch.no_grad():
        expected = _first_output(model(ids, **kwargs))
        assert torch.equal(_first_output(reloaded(ids, **kwargs)), expected)
        for name, scorer in ssacli.scorers_of(reloaded).items():
            original = ssacli.scorers_of(model)[name]
            assert torch.equal(scorer.b_raw, original.b_raw) and torch.equal(scorer.n_raw, original.n_raw)
        # Plain transformers builds this folder only with ssacli's attention (registered in this
        # process; without ssacli it refuses: tests/models/test_plain_transformers.py, in a fresh
        # interpreter): its scorer is not softmax and was never measured close to it.
        config = json.loads((out / "config.json").read_text())
        assert config["attn_implementation"] == "ssacli"
        assert config["model_type"] == guarded_type(model.config.model_type)  # only ssacli knows it
        plain = AUTO[FAMILIES[family]["kind"]].from_pretrained(out).eval()
        if attention_layout(model) is None:  # t5: one attention class at three kinds of place
            with pytest.raises(RuntimeError, match="ssacli.load_model"):
                plain(ids, **kwargs)
        else:
            assert torch.equal(_first_output(plain(ids, **kwargs)), expected)
        # Saved as a faithful conversion (fidelity to softmax met), plain transformers loads it as the
        # original architecture (softmax, no warning about unexpected keys: scorer tensors live in
        # their own file).
        faithful = {"source": family, "fidelity": {"from": "softmax", "target": {"met": True}}}
        plain_folder = save_model(loaded, tmp_path / "faithful", meta=faithful)
        plain = AUTO[FAMILIES[family]["kind"]].from_pretrained(plain_folder)
        assert type(plain) is type(model)
        assert not any(".ssacli_scorer." in k for k in plain.state_dict())
        ssacli.restore(model)
        assert torch.allclose(_first_output(plain.eval()(ids, **kwargs)), _first_output(model(ids, **kwargs)),
                              atol=1e-5)  # fmt: skip


def _first_output(output):
    return output.logits if hasattr(output, "logits") else output.last_hidden_state


def test_icl_round_trip(tmp_path):
    loaded, report = convert("builtin:every-softmax", "ssa:init=faithful", tmp_path / "icl")
    reloaded = ssacli.load(str(tmp_path / "icl"))
    assert reloaded.spec.scorer == "ssa:init=faithful"
    assert reloaded.spec.training["fidelity"]["kl_per_token"] == report["kl_per_token"]
    tokens = torch.randn(3, 20)
    with torch.no_grad():
        assert torch.equal(reloaded(tokens), loaded.model(tokens))


def test_refusals(tmp_path):
    existing = tmp_path / "exists"
    existing.mkdir()
    with pytest.raises(UsageError, match="already exists; pass --overwrite"):
        convert("builtin:every-softmax", "ssa", existing)
    source = tmp_path / "src"
    model = build_model("gpt2")
    model.save_pretrained(source)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in source.iterdir())
    with pytest.raises(UsageError, match="input model's folder"):
        convert(str(source), "ssa", source, overwrite=True)
    assert sorted((p.name, p.stat().st_mtime_ns) for p in source.iterdir()) == before
    config = AutoConfig.for_model("bloom", vocab_size=VOCAB, n_layer=1, hidden_size=16, n_head=2)
    bloom = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with pytest.raises(UnsupportedModelError, match="'bloom'"):
        convert(loaded_of(bloom), "ssa")
    with pytest.raises(ssacli.SpecError):
        convert(loaded_of(build_model("gpt2")), "ssa:bogus=1")
    assert not (tmp_path / "never").exists()


def test_corrupt_scorer_file_is_an_input_error(tmp_path):
    loaded, _ = convert(loaded_of(build_model("gpt2")), "ssa", samples=2, length=8)
    out = save_model(loaded, tmp_path / "c")
    (out / SCORER_FILE).write_bytes((out / SCORER_FILE).read_bytes()[:40])
    with pytest.raises(InputError, match="corrupt or truncated"):
        ssacli.load(str(out))


def test_public_functions_are_not_shadowed_by_submodules():
    """Importing a submodule sets it as a package attribute; no public function may share a
    submodule's name, or ``ssacli.NAME`` turns into the module after first use."""
    import pkgutil

    submodules = {info.name for info in pkgutil.iter_modules(ssacli.__path__)}
    callables = {name for name in ssacli.__all__ if name[0].islower() and name != "__version__"}
    assert not callables & submodules
    for _ in range(2):
        assert callable(ssacli.convert) and callable(ssacli.diagnose) and callable(ssacli.load)


# ---- m=auto: the smallest m per layer that meets the fidelity target ------------------------------

WIDE = 0.5  # initializer_range: attention logits far wider than N(0, 1)


def wide_extra(family: str):
    """llama and gemma2 from the test families; electra (encoder, no head) and xlm-roberta (masked LM)
    built here, all with initializer_range 0.5."""
    if family in FAMILIES:
        return build_model(family, initializer_range=WIDE)
    from transformers import AutoModelForMaskedLM

    shape = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                 max_position_embeddings=80, vocab_size=VOCAB, pad_token_id=0, initializer_range=WIDE,
                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # fmt: skip
    if family == "electra":
        config = AutoConfig.for_model("electra", embedding_size=32, **shape)
        torch.manual_seed(0)
        return AutoModel.from_config(config, attn_implementation="eager").eval()
    config = AutoConfig.for_model("xlm-roberta", **shape)
    torch.manual_seed(0)
    return AutoModelForMaskedLM.from_config(config, attn_implementation="eager").eval()


def calibration_inputs(samples: int = 8, length: int = 64) -> torch.Tensor:
    """The inputs convert measures on for a model without a tokenizer: seeded random ids."""
    from ssacli.diagnosis.plan import TokenSource

    source = TokenSource(None, text=None, random_ids=False, vocab_size=VOCAB, seed=0)
    return torch.tensor(source.sequences(samples, length))


def eager_outputs(model, ids):
    with torch.no_grad():
        out = model(input_ids=ids)
    return (out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state).double()


@pytest.mark.parametrize("family", ["llama", "gemma2", "electra", "xlm-roberta"])
def test_m_auto_meets_the_default_target_on_wide_models(family):
    original = wide_extra(family)  # the reference: the model's own eager softmax path
    loaded, report = convert(loaded_of(wide_extra(family)), "ssa:init=faithful")
    ids = calibration_inputs()
    before, after = eager_outputs(original, ids), eager_outputs(loaded.model, ids)
    if after.shape[-1] == VOCAB:  # a vocabulary: KL per token, by hand, <= 1e-3
        log_p, log_q = F.log_softmax(before, -1), F.log_softmax(after, -1)
        kl = float((log_p.exp() * (log_p - log_q)).sum(-1).mean())
        assert report["target"] == {"metric": "kl_per_token", "max": 1e-3, "met": True}
        assert kl <= 1e-3 and kl == pytest.approx(
            report["kl_per_token"], rel=1e-4, abs=float32_kl_resolution(log_p)
        )
    else:  # encoder without a head: relative error of the last hidden state, <= 1e-2
        error = float((after - before).norm() / before.norm())
        assert report["target"] == {"metric": "relative_error", "max": 1e-2, "met": True}
        assert error <= 1e-2 and error == pytest.approx(report["relative_error"], rel=1e-4)
    scorers = list(ssacli.scorers_of(loaded.attention_root).values())
    assert [row["m"] for row in report["layers"]] and len(report["layers"]) == len(scorers)
    for row, scorer in zip(report["layers"], scorers):
        m = row["m"]
        assert m == 2 ** round(torch.log2(torch.tensor(m)).item())  # a power of two
        torch.testing.assert_close(scorer.n, torch.full_like(scorer.n, m), rtol=1e-6, atol=0)
        torch.testing.assert_close(scorer.b, torch.full_like(scorer.b, 1 / m), rtol=1e-6, atol=0)


def test_m_auto_is_the_smallest_grid_m_it_verified():
    """Halving every chosen m misses the target (measured independently): the choice is not wasteful
    by a whole grid step everywhere at once."""
    from ssacli.conversion.m_auto import set_faithful_m

    loaded, report = convert(loaded_of(wide_extra("llama")), "ssa:init=faithful")
    ms = [row["m"] for row in report["layers"]]
    if all(m == 1 for m in ms):
        pytest.skip("already at the smallest m")
    original, ids = wide_extra("llama"), calibration_inputs()
    set_faithful_m(loaded.attention_root, [max(1.0, m / 2) for m in ms])
    log_p = F.log_softmax(eager_outputs(original, ids), -1)
    log_q = F.log_softmax(eager_outputs(loaded.model, ids), -1)
    assert float((log_p.exp() * (log_p - log_q)).sum(-1).mean()) > 1e-3


def test_m_auto_with_a_planted_sink_head():
    """GPT-2 whose head 0 of layer 0 gives key 0 a logit of +20 from every query."""

    def plant(model):
        attn = model.transformer.h[0].attn
        d, heads = model.config.n_embd, model.config.n_head
        hd = d // heads
        u = torch.ones(hd) / hd**0.5

        def hook(module, args, output):
            q, k, v = output.split(d, dim=-1)
            q, k = q.clone(), k.clone()
            q[..., :hd] = u  # every query of head 0 is u
            k[:, 0, :hd] = 20 * hd**0.5 * u / u.dot(u)  # so q·k0/√d = 20
            return torch.cat([q, k, v], dim=-1)

        attn.c_attn.register_forward_hook(hook)
        return model

    original = plant(build_model("gpt2", initializer_range=WIDE))
    converted = plant(build_model("gpt2", initializer_range=WIDE))
    loaded, report = convert(loaded_of(converted), "ssa:init=faithful")
    assert report["layers"][0]["max_abs_logit"] >= 20
    ids = calibration_inputs()
    log_p = F.log_softmax(eager_outputs(original, ids), -1)
    log_q = F.log_softmax(eager_outputs(loaded.model, ids), -1)
    kl = float((log_p.exp() * (log_p - log_q)).sum(-1).mean())
    assert kl <= 1e-3 and report["target"]["met"]


def test_an_unmeetable_target_exits_5_and_writes_nothing(tmp_path, monkeypatch, capsys):
    from ssacli.errors import JobFailedError

    folder, out = tmp_path / "llama", tmp_path / "out"
    build_model("llama", initializer_range=WIDE).save_pretrained(folder)
    with pytest.raises(JobFailedError, match="cannot meet the fidelity target"):
        convert(str(folder), "ssa:init=faithful", out, max_error=1e-30)
    assert not out.exists()
    args = ["convert", str(folder), "--scorer", "ssa:init=faithful", "--max-error", "1e-30",
            "--out", str(out)]  # fmt: skip
    code, _, stderr = run_main(args, monkeypatch, capsys)
    assert code == 5, stderr
    lines = [line for line in stderr.splitlines() if "fidelity target" in line]
    assert len(lines) == 1 and "nothing was written" in lines[0]
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["llama"]


def test_explicit_m_still_works_and_reports_its_target():
    loaded, report = convert(loaded_of(wide_extra("llama")), "ssa:init=faithful,m=1024")
    assert "layers" not in report and report["target"]["metric"] == "kl_per_token"
    for scorer in ssacli.scorers_of(loaded.attention_root).values():
        torch.testing.assert_close(scorer.n, torch.full_like(scorer.n, 1024.0))


def test_cli_convert_prints_the_per_layer_table(tmp_path):
    from typer.testing import CliRunner

    from ssacli.cli import app

    folder, out = tmp_path / "llama", tmp_path / "out"
    build_model("llama", initializer_range=WIDE).save_pretrained(folder)
    result = CliRunner().invoke(
        app, ["convert", str(folder), "--scorer", "ssa:init=faithful", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    meta = json.loads((out / META_FILE).read_text())
    layers = meta["fidelity"]["layers"]
    assert "m=auto chose m" in result.output and "attention-row KL" in result.output
    for row in layers:
        assert f"{row['layer']:>5}  {row['m']:<8g}" in result.output
    reloaded = ssacli.load(str(out))  # per-layer b, n come back from the scorer file
    for row, scorer in zip(layers, ssacli.scorers_of(reloaded).values()):
        torch.testing.assert_close(scorer.n, torch.full_like(scorer.n, row["m"]), rtol=1e-6, atol=0)


# ---- preset=authors --------------------------------------------------------------------------------


def test_preset_authors_has_one_learned_n_per_layer_and_a_fixed_b():
    model = build_model("llama", initializer_range=WIDE)
    ssacli.apply_scorer(model, "ssa:preset=authors")
    scorers = list(ssacli.scorers_of(model).values())
    assert len(scorers) == model.config.num_hidden_layers
    for scorer in scorers:
        assert scorer.n_raw.numel() == 1 and scorer.n_raw.requires_grad
        assert scorer.b_raw.numel() == 1 and not scorer.b_raw.requires_grad
        torch.testing.assert_close(scorer.n, torch.tensor([1.5]))
        torch.testing.assert_close(scorer.b, torch.tensor([0.8]))
    trainable = [n for n, p in model.named_parameters() if "ssacli_scorer" in n and p.requires_grad]
    assert len(trainable) == len(scorers) and all(n.endswith("n_raw") for n in trainable)
    # the weights by hand: (1 + 0.8|x|)^(sgn(x)·1.5), normalized over the visible keys
    x = torch.randn(2, 4, 5, 7, dtype=torch.float64) * 3
    mask = torch.rand(2, 1, 5, 7) > 0.3
    mask[..., 0] = True
    power = (1 + 0.8 * x.abs()) ** (torch.sign(x) * 1.5) * mask
    expected = power / power.sum(-1, keepdim=True)
    torch.testing.assert_close(scorers[0](x, mask), expected, rtol=1e-6, atol=1e-12)
    assert ssacli.make_scorer("ssa:init=authors").spec == "ssa:init=authors"
    with pytest.raises(UsageError, match="same option"):
        ssacli.make_scorer("ssa:preset=authors,init=paper")


def test_m_auto_on_a_model_with_learned_sinks():
    """gpt-oss's learned sink (s_aux) is one more key: m=auto scores it like any logit and the
    converted model still meets the target, measured by hand against the model's own eager path."""
    from ssacli.testing.tiny_models import build_tiny

    original = build_tiny("gpt_oss", "causal")
    loaded, report = convert(loaded_of(build_tiny("gpt_oss", "causal")), "ssa:init=faithful")
    ids = calibration_inputs(length=32)
    log_p = F.log_softmax(eager_outputs(original, ids), -1)
    log_q = F.log_softmax(eager_outputs(loaded.model, ids), -1)
    kl = float((log_p.exp() * (log_p - log_q)).sum(-1).mean())
    assert report["target"]["met"] and kl <= 1e-3
    assert len(report["layers"]) == len(ssacli.scorers_of(loaded.attention_root))


def test_attaching_m_auto_uncalibrated_is_refused_and_leaves_the_model_untouched():
    """m=auto is chosen from the model's own logits: attaching it alone would silently use a fixed
    placeholder m (on this wide-logit model 128 misses the documented 1e-3 KL), so it is refused."""
    from ssacli.errors import SpecError

    model = wide_extra("llama")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(SpecError, match=r"ssacli\.convert\(model, spec\).*m=128"):
        ssacli.apply_scorer(model, "ssa:init=faithful")
    assert ssacli.scorers_of(model) == {} and model.state_dict().keys() == state.keys()
    # an explicit m is a complete start: attached as asked
    ssacli.apply_scorer(model, "ssa:init=faithful,m=128")
    ns = [float(s.n.detach().min()) for s in ssacli.scorers_of(model).values()]
    assert ns and ns == pytest.approx([128.0] * len(ns), rel=1e-6)


def test_convert_calibrates_a_model_in_memory_in_place():
    """ssacli.convert takes the transformers model itself (what the refusal above points to): m is
    chosen per layer and the model, converted in place, meets the target against its own eager path."""
    original, model = wide_extra("llama"), wide_extra("llama")
    loaded, report = convert(model, "ssa:init=faithful")
    assert loaded.model is model and ssacli.scorers_of(model)
    ids = calibration_inputs()
    log_p = F.log_softmax(eager_outputs(original, ids), -1)
    log_q = F.log_softmax(eager_outputs(model, ids), -1)
    kl = float((log_p.exp() * (log_p - log_q)).sum(-1).mean())
    assert report["target"]["met"] and kl <= 1e-3
    assert [row["m"] for row in report["layers"]] == [
        float(s.n.detach().mean()) for s in ssacli.scorers_of(model).values()
    ]
