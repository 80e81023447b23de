"""ssacli.convert: faithful-init fidelity, the saved folder's round trip, and refusals."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import FAMILIES, VOCAB, build_model
from torch.nn import functional as F
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM

import ssacli
from ssacli.conversion import convert, fidelity, save_model
from ssacli.errors import InputError, UnsupportedModelError, UsageError
from ssacli.models.checkpoint import META_FILE, MODEL_FORMAT, SCORER_FILE
from ssacli.models.kinds import kind_of, max_positions
from ssacli.models.loading import LoadedModel

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
        # Plain transformers loads the same folder as the original architecture (softmax, no warning
        # about unexpected keys: scorer tensors live in their own file).
        plain = AUTO[FAMILIES[family]["kind"]].from_pretrained(out)
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
