"""Never silently wrong: every model family of the installed transformers is either exact through
ssacli or refused with a reason (ssacli.testing.audit), and docs/models.md is that audit's table (on
the release it was measured on, AUDITED_ON; on another the drift tests skip as stale).
Learned sinks (gpt-oss): the softmax path equals the model's eager path, on the eager, fused and
observed routes, over padding, sliding layers and KV-cache generation; every scorer's sink is an
extra, always visible key with a zero value. No attention argument is ignored."""

from __future__ import annotations

import copy
import importlib.util
import os
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import GptOssConfig, GptOssForCausalLM

import ssacli
from ssacli.attention.arguments import ARGUMENTS, REFUSED_ARGUMENTS, attention_call_arguments
from ssacli.attention.audited import AUDITED_FAMILIES, AUDITED_ON
from ssacli.attention.forward import SCORER_ATTR, ssacli_attention_forward
from ssacli.attention.interface import unaudited_reason, unsupported_reason
from ssacli.attention.masks import EAGER_MASK_FAMILIES
from ssacli.attention.sinks import scores_and_sink
from ssacli.errors import UnsupportedModelError
from ssacli.testing import audit, audit_record, tiny_models

ROOT = Path(__file__).resolve().parents[2]
TOL = 1e-5


# ---- the all-family audit ---------------------------------------------------------------------------


# Re-audited on every run even while the record is current: a decoder, an encoder, an
# encoder-decoder, the learned-sink family, the paths of ssacli's own that only some families reach
# (eager's float mask; a sink logit per query row with a sliding window: inkling2_text), and the first
# refused and first not-buildable family of the record (the audit's other two outcomes). The record
# cannot see the CPU; these rows can.
SAMPLE = ("llama", "bert", "t5", "gpt_oss", "inkling2_text", *EAGER_MASK_FAMILIES)


@pytest.fixture(scope="module")
def recorded():
    """The audit's record while its fingerprint is this installation's (ssacli.testing.audit_record),
    else None: the drift tests then audit every family."""
    found, why = audit_record.load()
    if found is None or os.environ.get(audit_record.FULL_ENV, "") not in ("", "0"):
        print(f"\nall-family audit in full: {why or audit_record.FULL_ENV + '=1'}")
        return None
    return found


@pytest.fixture(scope="module")
def results(recorded):
    if recorded is not None:
        return recorded
    started = time.perf_counter()
    found = audit.audit()
    print(f"\n{audit.summary(found)} ({time.perf_counter() - started:.0f} s)")
    for result in found:
        if result.status == "not-buildable":
            print(f"  not buildable tiny: {result.family}: {result.reason}")
    return found


def sample(results) -> list[str]:
    firsts = [next(r.family for r in sorted(results, key=lambda r: r.family) if r.status == status)
              for status in ("refused", "not-buildable")]  # fmt: skip
    return [*SAMPLE, *firsts]


@pytest.mark.families
def test_a_sample_of_families_audits_as_recorded(recorded):
    """While the record stands in for the audit, a sample audits now as it did then (status and
    reason; the measured differences are rounding and stay under the tolerance)."""
    if recorded is None:
        pytest.skip("the audit ran in full: every family is compared, not a sample")
    by_family = {r.family: r for r in recorded}
    for family in sample(recorded):
        then = by_family[family]
        now = audit.audit_family(family, then.kind)
        assert (now.status, now.reason) == (then.status, then.reason), (family, now, then)
        if now.status == "exact" and not now.reason:
            assert now.difference <= audit.TOLERANCE and now.attention <= audit.TOLERANCE, now


def test_the_audit_record_is_current():
    """On the release the table was measured on, the record's fingerprint matches this checkout: a
    change to a module the audit loads, without `python scripts/models_table.py`, fails here (the
    suite still audits in full meanwhile, so nothing is hidden; this keeps it from staying slow)."""
    skip_if_stale()
    found, why = audit_record.load()
    assert found is not None, why


def test_the_fingerprint_changes_with_each_release_and_source(monkeypatch, tmp_path):
    import transformers

    sources = ["attention/forward.py", "testing/audit.py"]
    base = audit_record.fingerprint(sources)
    assert set(base["sources"]) == set(sources) and all(len(sha) == 64 for sha in base["sources"].values())
    monkeypatch.setattr(transformers, "__version__", "99.0.0")
    assert audit_record.fingerprint(sources)["transformers"] == "99.0.0"
    monkeypatch.undo()
    package = tmp_path / "ssacli"
    (package / "attention").mkdir(parents=True)
    (package / "attention" / "forward.py").write_text("x = 1\n")
    monkeypatch.setattr(audit_record, "PACKAGE", package)
    first = audit_record.fingerprint(["attention/forward.py"])["sources"]["attention/forward.py"]
    (package / "attention" / "forward.py").write_text("x = 2\n")
    assert audit_record.fingerprint(["attention/forward.py"])["sources"]["attention/forward.py"] != first
    record = tmp_path / "record.json"
    record.write_text(audit_record.record_text([audit.FamilyResult("llama", "causal", "exact")],
                                               ["attention/forward.py"]))  # fmt: skip
    assert audit_record.load(record)[0] == [audit.FamilyResult("llama", "causal", "exact")]
    (package / "attention" / "forward.py").write_text("x = 3\n")
    found, why = audit_record.load(record)
    assert found is None and "ssacli/attention/forward.py changed" in why


@pytest.mark.families
def test_no_family_is_accepted_and_different(results):
    """The acceptance line: zero families silently different; each refusal and skip has a reason."""
    different = [f"{r.family}: {r.reason}" for r in results if r.status == "different"]
    assert not different, "accepted but not exact:\n" + "\n".join(different)
    assert all(r.reason for r in results if r.status in ("refused", "not-buildable"))
    exact = {r.family for r in results if r.status == "exact"}
    # the families the hand-written exactness tests cover, and gpt-oss with its learned sinks
    assert {"llama", "mistral", "gemma2", "gpt2", "bert", "bart", "t5", "gpt_oss"} <= exact
    assert len(results) == len(tiny_models.families()) and len(exact) > len(results) / 2


@pytest.mark.families
def test_refused_families_name_themselves_and_what_it_would_take(results):
    for result in results:
        if result.status == "refused":
            assert f"'{result.family}'" in result.reason or "share=layer" in result.reason, result
            assert "would take" in result.reason or "share=layer" in result.reason, result


def skip_if_stale():
    """The drift tests compare committed files with the installed transformers: on a release other
    than the one they were measured on they skip with that reason (SSACLI_STRICT_AUDIT=1: they run)."""
    reason = audit.stale_table()
    if reason:
        pytest.skip(reason)


@pytest.mark.families
def test_models_md_is_the_audit_table(results):
    """docs/models.md cannot drift: it must be what scripts/models_table.py writes for this audit."""
    skip_if_stale()
    spec = importlib.util.spec_from_file_location("models_table", ROOT / "scripts" / "models_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    committed = (ROOT / "docs" / "models.md").read_text()
    assert committed == module.render(results), (
        "docs/models.md differs from the audit: run `python scripts/models_table.py`"
    )


@pytest.mark.families
def test_the_audited_set_is_the_audit(results):
    """ssacli/attention/audited.py, which every output reads to mark a model audited or not, is what
    scripts/models_table.py writes for this audit: the families found exact, no more."""
    skip_if_stale()
    spec = importlib.util.spec_from_file_location("models_table", ROOT / "scripts" / "models_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    committed = (ROOT / "ssacli" / "attention" / "audited.py").read_text()
    assert committed == module.render_audited(results), "audited.py differs: run scripts/models_table.py"
    assert AUDITED_FAMILIES == {r.family for r in results if r.status == "exact"}
    assert all(unaudited_reason(r.family) for r in results if r.status == "not-buildable")


def test_the_readme_test_command_pins_the_audited_release():
    """The README's test command (what CI runs) installs the release docs/models.md was measured on, so
    the drift tests run strictly there."""
    readme = (ROOT / "README.md").read_text()
    command = readme.split("<!-- test-command -->", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    assert f"transformers=={AUDITED_ON} " in command, command


def test_a_stale_table_skips_unless_strict(monkeypatch):
    import transformers

    monkeypatch.delenv(audit.STRICT_ENV, raising=False)
    monkeypatch.setattr(transformers, "__version__", AUDITED_ON)
    assert audit.stale_table() is None
    monkeypatch.setattr(transformers, "__version__", "99.0.0")
    reason = audit.stale_table()
    assert f"measured on transformers {AUDITED_ON}; installed 99.0.0" in reason
    assert "scripts/models_table.py" in reason
    monkeypatch.setenv(audit.STRICT_ENV, "1")
    assert audit.stale_table() is None


@pytest.mark.families
def test_exact_means_exact_attention_outputs(results):
    """Every exact family's attention outputs were compared with eager's, module by module on the same
    inputs; an exact family whose logits differ says why (rounding amplified outside attention)."""
    for r in results:
        if r.status == "exact":
            assert r.attention is not None and r.attention <= audit.TOLERANCE, r
            assert r.difference <= audit.TOLERANCE or r.reason == audit.AMPLIFIED, r
            assert not r.reason or r.reason == audit.AMPLIFIED, r


@pytest.mark.skipif("zaya" not in tiny_models.families(), reason="this transformers has no zaya")
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_zaya_attention_is_exact_over_seeds(seed):
    """zaya (a top-1 router with a skip expert after each attention layer, its residual in float32):
    on each seed its attention outputs equal eager's on the same inputs, and its logits do, or differ
    only by rounding amplified outside attention (eager's attention outputs give eager's logits)."""
    model = tiny_models.build_tiny("zaya", "causal", seed=seed)
    ids, mask = audit.padded_batch("causal")
    found = audit.compare(model, ssacli.apply_scorer(copy.deepcopy(model), "softmax"), "causal", ids, mask)
    assert found.attention <= audit.TOLERANCE, found
    assert found.logits <= audit.TOLERANCE or found.outside <= audit.TOLERANCE, found


def amplifying_llama(seen_only_by_ssacli: bool = False):
    """build_tiny for the audit, whose llama amplifies rounding outside attention: the final norm's input
    h becomes h0 + 1e4 (h - h0), h0 being eager's on the audit's batch (a router's decision in miniature:
    eager's path is unchanged, ssacli's differences of ~1e-7 grow past the tolerance). Like zaya it
    does not run in float64. ``seen_only_by_ssacli``: instead, ssacli's model alone shifts its logits
    (a difference outside attention, e.g. a mask read there)."""

    def shift(module, args, out):
        if module.config._attn_implementation == "ssacli":
            out.logits = out.logits + 1e-3 * out.logits.abs().max()

    def build(family, kind, dtype=torch.float32, **kwargs):
        if dtype != torch.float32:
            raise RuntimeError("no float64 here (like zaya, whose eager path is NaN there)")
        model = tiny_models.build_tiny("llama", "causal")
        if seen_only_by_ssacli:
            model.register_forward_hook(shift)
            return model
        seen = {}
        handle = model.model.norm.register_forward_pre_hook(lambda m, a: seen.setdefault("h", a[0].clone()))
        audit.run(model, "causal", *audit.padded_batch("causal"))
        handle.remove()

        def amplify(module, args):
            h, h0 = args[0], seen["h"]
            return (h0 + 1e4 * (h - h0),) if h.shape == h0.shape else None

        model.model.norm.register_forward_pre_hook(amplify)
        return model

    return build


def test_rounding_amplified_outside_attention_is_exact_and_says_so(monkeypatch):
    monkeypatch.setattr(audit, "build_tiny", amplifying_llama())
    result = audit.audit_family("llama", "causal")
    if result.difference == 0:
        pytest.skip("ssacli's softmax path is bitwise eager's here: nothing to amplify")
    assert result.status == "exact" and result.reason == audit.AMPLIFIED, result
    assert result.difference > audit.TOLERANCE and result.attention <= audit.TOLERANCE
    assert result.outside <= audit.TOLERANCE


def test_a_difference_outside_attention_stays_different(monkeypatch):
    monkeypatch.setattr(audit, "build_tiny", amplifying_llama(seen_only_by_ssacli=True))
    result = audit.audit_family("llama", "causal")
    assert result.status == "different" and "outside attention" in result.reason, result
    assert result.attention <= audit.TOLERANCE and result.outside > audit.TOLERANCE


def test_the_audit_catches_a_silent_difference(monkeypatch):
    """The audit is not vacuous: an attention function that ignores the sinks is caught (the bug this
    issue started from: relative difference ~1 on gpt-oss while supports() said True)."""
    import ssacli.attention.forward as attention_forward

    monkeypatch.setattr(attention_forward, "sink_logits", lambda kwargs: None)
    result = audit.audit_family("gpt_oss", "causal")
    assert result.status == "different" and result.difference > 1e-2


def test_tiny_configs_are_tiny():
    config = tiny_models.tiny_config("gpt_oss")
    assert config.hidden_size == 32 and config.num_attention_heads == 4 and config.num_key_value_heads == 2
    assert config.vocab_size == tiny_models.VOCAB and config.sliding_window == tiny_models.WINDOW
    assert sorted(set(config.layer_types)) == ["full_attention", "sliding_attention"]


# ---- gpt-oss: learned sinks --------------------------------------------------------------------------


def gpt_oss(seed: int = 0) -> nn.Module:
    """2 layers (sliding, full), 4 heads over 2 KV heads, window 3, random non-zero sinks."""
    config = GptOssConfig(
        vocab_size=128, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=3,
        layer_types=["sliding_attention", "full_attention"], pad_token_id=0, eos_token_id=2, bos_token_id=1,
        max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = GptOssForCausalLM._from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.copy_(torch.randn(4) * 2)
    return model


def left_padded():
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 120, (2, 8), generator=gen)
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, :3] = 0
    ids[mask == 0] = 0
    return ids, mask


def relative(ref, got, valid):
    return ((ref - got)[valid].abs().max() / ref[valid].abs().max()).item()


@pytest.mark.parametrize("backend", ["eager", "auto", "fused"])
def test_gpt_oss_softmax_is_exact_with_random_sinks(backend):
    model = gpt_oss()
    assert all(m.self_attn.sinks.abs().min() > 0.01 for m in model.model.layers)
    ids, mask = left_padded()
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask).logits
        ours = ssacli.apply_scorer(copy.deepcopy(model), "softmax")
        with ssacli.attention_backend(ours, backend):
            got = ours(input_ids=ids, attention_mask=mask).logits
        plain = ssacli.apply_scorer(copy.deepcopy(model), "softmax")
    valid = mask.bool()
    assert relative(ref, got, valid) <= TOL, f"{backend}: {relative(ref, got, valid):.3g}"
    assert ssacli.supports(model)
    # the sinks matter here: dropping them changes the logits by far more than the tolerance
    for layer in plain.model.layers:
        layer.self_attn.sinks.data.fill_(-1e4)
    with torch.no_grad():
        assert relative(ref, plain(input_ids=ids, attention_mask=mask).logits, valid) > 1e-2


def test_gpt_oss_kv_cache_generation_is_exact():
    model = gpt_oss()
    ours = ssacli.apply_scorer(copy.deepcopy(model), "softmax")
    ids, mask = left_padded()
    kwargs = dict(
        attention_mask=mask, max_new_tokens=3, min_new_tokens=3, do_sample=False, use_cache=True,
        output_logits=True, return_dict_in_generate=True, pad_token_id=0,
    )  # fmt: skip
    with torch.no_grad():
        ref = model.generate(ids, **kwargs)
        got = ours.generate(ids, **kwargs)
    assert torch.equal(ref.sequences, got.sequences) and len(got.logits) == 3
    every = torch.ones(ids.shape[0], dtype=torch.bool)
    assert max(relative(r, g, every) for r, g in zip(ref.logits, got.logits, strict=True)) <= TOL


def test_gpt_oss_weights_are_the_sink_formula():
    """weights = exp(x) / (exp(s_h) + Σ exp(x)) over visible keys: the eager path's own weights."""
    model = gpt_oss()
    ours = ssacli.apply_scorer(copy.deepcopy(model), "softmax")
    ids, mask = left_padded()
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
        got = ours(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    rows = mask.bool()[:, None, :, None]  # real queries
    for r, g in zip(ref, got, strict=True):
        assert torch.allclose(torch.where(rows, r, 0), torch.where(rows, g, 0), atol=1e-6)
    sink_mass = 1 - got[0].sum(-1)[:, :, 3:]  # left padding of row 1 is 3
    assert (sink_mass > 1e-3).all()


@pytest.mark.parametrize("spec", ["ssa", "temperature:t=0.7"])
def test_fused_kernels_take_the_sink_as_a_key(spec):
    """The fused kernels know no sinks; with_sink_key makes the sink an ordinary key. auto (fused)
    equals eager (the scorer's own forward with the sink column) on gpt-oss."""
    model = ssacli.apply_scorer(gpt_oss(), spec)
    ids, mask = left_padded()
    with torch.no_grad():
        with ssacli.attention_backend(model, "eager"):
            ref = model(input_ids=ids, attention_mask=mask).logits
        with ssacli.attention_backend(model, "fused"):
            got = model(input_ids=ids, attention_mask=mask).logits
    assert relative(ref, got, mask.bool()) <= 1e-5


def test_ssa_keeps_gpt_oss_causal():
    model = ssacli.apply_scorer(gpt_oss(), "ssa")
    ids = torch.randint(3, 120, (1, 8))
    changed = ids.clone()
    changed[0, 6:] += 1
    with torch.no_grad():
        a, b = model(ids).logits[0, :6], model(changed).logits[0, :6]
    assert torch.allclose(a, b, atol=TOL, rtol=0)


# ---- what a sink means for each scorer ----------------------------------------------------------------


def naive_logits():
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 3, 4, 5, generator=gen, dtype=torch.float64) * 2
    visible = torch.ones(2, 1, 4, 5, dtype=torch.bool).tril(1)
    sink = torch.randn(3, generator=gen, dtype=torch.float64).reshape(1, 3, 1, 1)
    return x, visible, sink


def test_softmax_sink_is_the_formula():
    x, visible, sink = naive_logits()
    got = scores_and_sink(ssacli.make_scorer("softmax", num_heads=3), x, visible, sink)[0]
    e = torch.where(visible, x.exp(), 0)
    assert torch.allclose(got, e / (sink.exp() + e.sum(-1, keepdim=True)), atol=1e-12)


def test_ssa_sink_goes_through_the_same_transform():
    x, visible, sink = naive_logits()
    scorer = ssacli.make_scorer("ssa", num_heads=3)
    b, n = scorer.b.double().reshape(1, 3, 1, 1), scorer.n.double().reshape(1, 3, 1, 1)

    def t(v):
        return n * torch.sign(v) * torch.log1p(b * v.abs())

    e = torch.where(visible, t(x).exp(), 0)
    expected = e / (t(sink).exp() + e.sum(-1, keepdim=True))
    assert torch.allclose(scores_and_sink(scorer, x, visible, sink)[0], expected, atol=1e-12)


def test_a_sparse_scorer_can_give_the_sink_everything_or_nothing():
    x, visible, _ = naive_logits()
    scorer = ssacli.make_scorer("sparsemax")
    high = scores_and_sink(scorer, x, visible, torch.tensor(100.0, dtype=x.dtype).reshape(1, 1, 1, 1))[0]
    low = scores_and_sink(scorer, x, visible, torch.tensor(-100.0, dtype=x.dtype).reshape(1, 1, 1, 1))[0]
    assert torch.all(high == 0)  # the sink took all the mass
    assert torch.allclose(low, scorer(x, visible))  # the sink is outside the support: no effect


def test_cosformer_refuses_sinks():
    model = ssacli.apply_scorer(gpt_oss(), "cosformer")
    with pytest.raises(UnsupportedModelError, match="sink"):
        model(torch.randint(3, 120, (1, 5)))


# ---- no argument is ignored ------------------------------------------------------------------------


class SpyAttention(nn.Module):
    """A minimal routed attention module that passes an extra keyword to the attention function."""

    is_causal = True

    def __init__(self, **extra):
        super().__init__()
        self.extra = extra
        setattr(self, SCORER_ATTR, ssacli.make_scorer("softmax"))

    def forward(self, q, k, v):
        return ssacli_attention_forward(self, q, k, v, None, **self.extra)


def test_an_unknown_argument_is_refused():
    q = k = v = torch.randn(1, 2, 3, 4)
    with pytest.raises(UnsupportedModelError, match="'foo'"):
        SpyAttention(foo=1)(q, k, v)
    SpyAttention(foo=None)(q, k, v)  # the default value of an unknown argument changes nothing
    for name in ("indices", "block_indices"):
        with pytest.raises(UnsupportedModelError, match=name):
            SpyAttention(**{name: torch.zeros(1, 3, 2, dtype=torch.long)})(q, k, v)


def test_supports_reads_the_arguments_a_model_passes(monkeypatch):
    """A model class whose attention call passes an argument outside ARGUMENTS is not supported."""
    model = tiny_models.build_tiny("llama", "causal")
    assert unsupported_reason(model) is None
    from ssacli.attention import interface

    attention_class = type(model.model.layers[0].self_attn)
    fake = {attention_class: frozenset({"scaling", "foo"})}
    monkeypatch.setattr(interface, "passed_arguments", lambda cls: fake.get(cls, frozenset()))
    reason = unsupported_reason(model)
    assert reason is not None and "'foo'" in reason and "'llama'" in reason
    with pytest.raises(UnsupportedModelError, match="'foo'"):
        ssacli.apply_scorer(model, "softmax")


def test_every_argument_transformers_passes_is_known():
    """Each keyword of every attention_interface(...) call in the installed modeling files is either
    understood (ARGUMENTS) or refused by name (REFUSED_ARGUMENTS): a new one fails here."""
    import transformers

    unknown = {}
    for path in Path(transformers.__file__).parent.glob("models/*/modeling_*.py"):
        for name in attention_call_arguments(path.read_text()):
            if name not in ARGUMENTS and name not in REFUSED_ARGUMENTS:
                unknown.setdefault(name, path.parent.name)
    assert not unknown, f"attention arguments ssacli has not classified: {unknown}"


def test_packed_sequences_are_separated():
    """cu_seq_lens_q/k: a packed row of two sequences gives each the output it has alone."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 7, 4, generator=gen) for _ in range(3))
    cu = torch.tensor([0, 3, 7])
    module = SpyAttention(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=4, max_length_k=4)
    packed, _ = module(q, k, v)
    first, _ = SpyAttention()(q[:, :, :3], k[:, :, :3], v[:, :, :3])
    second, _ = SpyAttention()(q[:, :, 3:], k[:, :, 3:], v[:, :, 3:])
    assert torch.allclose(packed, torch.cat([first, second], dim=1), atol=1e-6)
