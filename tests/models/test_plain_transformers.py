"""Converted folders in plain transformers (issue 38, items 0-2; issue 51, item 6).

0. No folder whose scorer moved loads as softmax through an Auto class or pipeline: for every
   kind of folder ssacli writes (convert with a non-faithful spec, finetune, the recipe, train, a
   GPT-2), AutoConfig, AutoModelForCausalLM and pipeline, in a fresh interpreter without ssacli,
   refuse with ``import ssacli`` in the message, whatever ``attn_implementation`` is passed (issue
   51, item 6); the concrete class refuses without one and, given "sdpa", builds the softmax model
   with only transformers' warning quoting the guarded type (what README and docs/convert.md say).
   A faithful conversion that met its fidelity loads as softmax, by design.
1. After ``import ssacli.transformers`` the same four ways load each folder with its scorer and its
   learned values: logits equal to ssacli.load_model(DIR)'s.
2. Generation through that path is exact: greedy decoding with the KV cache gives the tokens and,
   at every step, the logits of a full recomputation without cache.
3. ``model.save_pretrained`` of a model built with ssacli's attention keeps the guard and reloads as
   the same model (issue 51).

Folders in the layouts written before (model_type ``ssacli-<type>``; the original model_type with
``attn_implementation: "ssacli"`` alone) still load through ssacli, and the second through Auto
classes after ``import ssacli``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, GPT2LMHeadModel, pipeline

import ssacli
import ssacli.transformers
from ssacli.models.checkpoint import ORIGINAL_TYPE_KEY, saved_config
from ssacli.models.guard import ATTENTION_KEY, GUARD_NOTE_KEY, LAYOUT_KEY, attention_layout, guarded_type
from ssacli.models.references import resolve_model_path
from ssacli.train.finetune import FinetuneConfig
from ssacli.train.recipe import RecipeConfig, convert_with_recipe
from tests.helpers.models import build_model
from tests.helpers.plain_transformers import EXPLICIT, IDS, NEEDS, WAYS, plain_loads, refuses_naming_ssacli

MODEL = "builtin:wikitext-softmax"
MOVED = ("ssa", "finetune", "recipe", "train", "gpt2")  # folders whose scorer is not softmax


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """One folder of each kind ssacli writes, at a tiny budget."""
    root = tmp_path_factory.mktemp("kinds")
    rng = random.Random(0)
    words = "the of and in a to was is for on as by with his at from that it an are".split()
    text = root / "text.txt"
    text.write_text("\n".join(" ".join(rng.choice(words) for _ in range(14)) + " ." for _ in range(300)))
    _, fidelity = ssacli.convert(MODEL, "ssa:init=faithful", root / "faithful", dtype="float32")
    assert fidelity["target"]["met"]
    _, fidelity = ssacli.convert(MODEL, "ssa:b=0.3,n=4", root / "ssa", dtype="float32")
    assert not fidelity["target"]["met"]
    settings = FinetuneConfig(data=str(text), steps=2, batch_size=2, seq_len=16, anneal_n=2.0, log_every=1)
    ssacli.finetune(str(root / "faithful"), settings, root / "finetune", device="cpu")
    recipe = RecipeConfig(data=str(text), transfer_steps=2, distill_steps=2, eval_every=2, batch_size=2,
                          seq_len=16, heldout_tokens=64)  # fmt: skip
    convert_with_recipe(MODEL, root / "recipe", recipe, device="cpu")
    # a tiny GPT-2 with 10x the default init spread: logits far from zero, where SSA is not softmax
    gpt2, _ = ssacli.convert(build_model("gpt2", initializer_range=0.2), "ssa:b=0.3,n=4")
    ssacli.save_model(gpt2, root / "gpt2")
    # plain transformers' own save (after import ssacli) of the recipe's model, run once
    plain = AutoModelForCausalLM.from_pretrained(root / "recipe", dtype=torch.float32)
    with torch.no_grad():
        plain(torch.tensor(IDS))
    plain.save_pretrained(root / "saved")
    kinds = {name: root / name for name in ("faithful", "ssa", "finetune", "recipe", "gpt2", "saved")}
    return {**kinds, "train": resolve_model_path("builtin:wikitext-ssa")}  # written by `ssacli train`


def reference_logits(folder: Path, dtype: str = "float32") -> torch.Tensor:
    loaded = ssacli.load_model(str(folder), device="cpu", dtype=dtype)
    with torch.no_grad():
        return loaded.model(torch.tensor(IDS), use_cache=False).logits


def test_the_guard_is_a_model_type_and_an_attention_only_ssacli_registers(folders):
    for kind in MOVED:
        config = json.loads((folders[kind] / "config.json").read_text())
        original = "gpt2" if kind == "gpt2" else "llama"
        assert config[ATTENTION_KEY] == "ssacli" and config[ORIGINAL_TYPE_KEY] == original
        assert config["model_type"] != original and NEEDS in config["model_type"]
        assert LAYOUT_KEY in config and f"`{NEEDS}`" in config[GUARD_NOTE_KEY]
    assert ATTENTION_KEY not in json.loads((folders["faithful"] / "config.json").read_text())
    # ssacli reads it back as an ordinary config of the original type, with no implementation chosen
    config = saved_config(folders["recipe"])
    assert config.model_type == "llama" and config.ssacli_scorer.startswith("ssa")
    assert config._attn_implementation is None and not hasattr(config, LAYOUT_KEY)
    assert not hasattr(config, ORIGINAL_TYPE_KEY)


def test_import_ssacli_registers_the_guarded_type_of_every_family_as_its_original():
    """AutoConfig (this process imported ssacli) maps every guarded type back to the original's
    own config class, so no model, config or model_type of the guarded name exists at run time."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES

    from ssacli.transformers_hook import GuardedConfig

    assert all(CONFIG_MAPPING[guarded_type(family)] is GuardedConfig for family in CONFIG_MAPPING_NAMES)
    config = AutoConfig.from_pretrained(resolve_model_path("builtin:wikitext-ssa"))
    assert type(config).__name__ == "LlamaConfig" and config.model_type == "llama"
    assert config._attn_implementation == "ssacli" and not hasattr(config, ORIGINAL_TYPE_KEY)


def softmax_logits(folder: Path, dtype: str = "float32") -> torch.Tensor:
    """The folder's weights with softmax attention: what a load that ignored the scorer computes."""
    loaded = ssacli.load_model(str(folder), device="cpu", dtype=dtype)
    with torch.no_grad():
        ssacli.restore(loaded.model)
        return loaded.model(torch.tensor(IDS), use_cache=False).logits


def test_without_ssacli_no_auto_class_runs_a_moved_scorer_as_softmax(folders, tmp_path):
    kinds = (*MOVED, "saved", "faithful")
    result = plain_loads([folders[k] for k in kinds], tmp_path, register=False, explicit=True)
    for kind in (*MOVED, "saved"):  # saved: model.save_pretrained of a model built with ssacli
        outcomes = result[str(folders[kind])]
        for way in [w for w in (*WAYS, *EXPLICIT) if w != "concrete:sdpa"]:
            assert refuses_naming_ssacli(way, outcomes[way]), (kind, way, outcomes[way])
        if kind == "saved":
            continue
        # The concrete class given "sdpa" reads config.json whatever its model type: the softmax
        # model, with transformers' warning quoting the guarded type (README, docs/convert.md)
        outcome = outcomes["concrete:sdpa"]
        assert outcome["scorers"] == [] and any(NEEDS in line for line in outcome["warned"]), outcome
        softmax, ssa = (
            softmax_logits(folders[kind], outcome["dtype"]),
            reference_logits(folders[kind], outcome["dtype"]),
        )
        assert relative_error(outcome["tensor"], softmax) < relative_error(outcome["tensor"], ssa) / 10, kind
    # A faithful conversion that met its fidelity target is the original with softmax, by design
    softmax = reference_logits(resolve_model_path(MODEL))
    for way in WAYS[1:]:
        outcome = result[str(folders["faithful"])][way]
        assert outcome["scorers"] == [] and outcome["class"] == "LlamaForCausalLM"
        torch.testing.assert_close(outcome["tensor"], softmax, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("order", [True, "after"], ids=["import-ssacli-first", "import-ssacli-after"])
def test_after_import_ssacli_every_way_loads_the_scorer_and_its_values(folders, tmp_path, order):
    result = plain_loads([folders[k] for k in MOVED], tmp_path, register=order)
    for kind in MOVED:
        spec = json.loads((folders[kind] / "ssacli.json").read_text())["scorer"]
        architecture = "GPT2LMHeadModel" if kind == "gpt2" else "LlamaForCausalLM"
        expected = {}
        for way in WAYS[1:]:
            outcome = result[str(folders[kind])][way]
            assert outcome.get("class") == architecture and outcome["scorers"] == [spec], (kind, way, outcome)
            dtype = outcome["dtype"]  # transformers keeps a float16 folder in float16: compare alike
            if dtype not in expected:
                expected[dtype] = reference_logits(folders[kind], dtype)
            assert relative_error(outcome["tensor"], expected[dtype]) <= 1e-6, (kind, way)
        # the scorer matters: the same weights under softmax compute something else
        loaded = ssacli.load_model(str(folders[kind]), device="cpu")
        with torch.no_grad():
            ssacli.restore(loaded.model)
            softmax = loaded.model(torch.tensor(IDS), use_cache=False).logits
        assert relative_error(softmax, reference_logits(folders[kind])) > 1e-3, kind


@torch.no_grad()
def greedy_exact(model, steps: int = 20) -> torch.Tensor:
    """Greedy decoding with the KV cache against a recomputation of the whole sequence without
    cache at every step: identical tokens, logits within float32 rounding. Returns the sequences."""
    prompt = torch.tensor(IDS)[:, :6]
    cached = model.generate(prompt, max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                            output_logits=True, return_dict_in_generate=True, pad_token_id=0)  # fmt: skip
    sequence = prompt
    for step in range(steps):
        full = model(sequence, use_cache=False).logits[:, -1]
        assert relative_error(cached.logits[step], full) <= 1e-5, step
        sequence = torch.cat([sequence, full.argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(cached.sequences, sequence)
    return sequence


@pytest.mark.parametrize("kind", ["ssa", "recipe", "gpt2"])
def test_generation_through_plain_transformers_is_exact_with_the_kv_cache(folders, kind):
    plain = AutoModelForCausalLM.from_pretrained(folders[kind], dtype=torch.float32).eval()
    sequences = greedy_exact(plain)
    assert ssacli.scorers_of(plain)  # attached on the first forward
    ours = ssacli.load_model(str(folders[kind]), device="cpu").model
    with torch.no_grad():
        again = ours.generate(torch.tensor(IDS)[:, :6], max_new_tokens=20, min_new_tokens=20, do_sample=False,
                              pad_token_id=0)  # fmt: skip
    assert torch.equal(again, sequences)


def test_pipeline_generates_what_the_model_generates(folders):
    generator = pipeline("text-generation", model=str(folders["recipe"]))
    [answer] = generator("the cat", max_new_tokens=8, do_sample=False, return_full_text=False)
    text = answer["generated_text"]
    loaded = ssacli.load_model(str(folders["recipe"]), device="cpu")
    ids = loaded.tokenizer("the cat", return_tensors="pt").input_ids
    with torch.no_grad():
        out = loaded.model.generate(ids, max_new_tokens=8, do_sample=False)
    assert text == loaded.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def test_save_pretrained_keeps_the_guard_and_round_trips(folders, tmp_path):
    """``model.save_pretrained`` of a model built with ssacli's attention writes the guard back and
    the scorers' tensors with the weights: reloaded, the same model (the fixture saved the recipe's
    through AutoModelForCausalLM; without ssacli every Auto way refuses it: the test above). The
    concrete class's config keeps it too once its scorers are attached; after ssacli.restore the
    model is the softmax one, and saves as such."""
    import copy
    import pickle

    from transformers import LlamaForCausalLM

    config = json.loads((folders["saved"] / "config.json").read_text())
    guard = (config["model_type"], config[ORIGINAL_TYPE_KEY], config[ATTENTION_KEY])
    assert guard == (guarded_type("llama"), "llama", "ssacli")
    again = AutoModelForCausalLM.from_pretrained(folders["saved"], dtype=torch.float32).eval()
    with torch.no_grad():
        logits = again(torch.tensor(IDS), use_cache=False).logits
    assert relative_error(logits, reference_logits(folders["recipe"])) <= 1e-6
    assert (
        type(pickle.loads(pickle.dumps(again.config)))
        is type(copy.deepcopy(again.config))
        is type(again.config)
    )

    concrete = LlamaForCausalLM.from_pretrained(folders["recipe"]).eval()
    ssacli.transformers.attach(concrete)
    concrete.save_pretrained(tmp_path / "concrete")
    assert json.loads((tmp_path / "concrete" / "config.json").read_text())["model_type"] == guarded_type(
        "llama"
    )
    ssacli.restore(concrete)
    concrete.save_pretrained(tmp_path / "softmax")
    config = json.loads((tmp_path / "softmax" / "config.json").read_text())
    assert config["model_type"] == "llama" and ATTENTION_KEY not in config


def test_attach_gives_the_scorers_before_any_forward_and_restore_goes_back_to_softmax(folders):
    model = GPT2LMHeadModel.from_pretrained(folders["gpt2"]).eval()
    assert not ssacli.scorers_of(model)  # transformers ran none of ssacli's code while loading
    ssacli.transformers.attach(model)
    scorers = ssacli.scorers_of(model)
    reference = ssacli.scorers_of(ssacli.load_model(str(folders["gpt2"]), device="cpu").model)
    assert scorers.keys() == reference.keys()
    for name, scorer in scorers.items():
        saved = reference[name].state_dict()
        assert all(torch.equal(value, saved[key]) for key, value in scorer.state_dict().items())
    assert all(p.requires_grad for p in scorers["transformer.h.0.attn"].parameters())  # trainable
    ids = torch.tensor(IDS)
    with torch.no_grad():
        ssa = model(ids).logits
        ssacli.restore(model)
        assert model.config._attn_implementation == "eager" and not ssacli.scorers_of(model)
        softmax = model(ids).logits
    assert relative_error(ssa, softmax) > 1e-3


def test_a_model_without_a_layout_refuses_at_its_first_forward(tmp_path):
    """An encoder-decoder's attention class sits at several kinds of place: no layout tells its
    modules apart, so even with ssacli registered only ssacli.load_model loads it."""
    from transformers import AutoModelForSeq2SeqLM

    loaded, _ = ssacli.convert(build_model("t5"), "ssa:b=0.3,n=4")
    assert attention_layout(loaded.model) is None
    folder = ssacli.save_model(loaded, tmp_path / "t5")
    model = AutoModelForSeq2SeqLM.from_pretrained(folder)
    ids = torch.tensor(IDS)
    with pytest.raises(RuntimeError, match="ssacli.load_model"):
        model(input_ids=ids, decoder_input_ids=ids)
    ssacli.load(str(folder))(input_ids=ids, decoder_input_ids=ids)  # ssacli's own path loads it


def test_folders_in_the_layouts_written_before_still_load(folders, tmp_path):
    """Layout 2 (issue 38 to 51: the original model_type, attn_implementation "ssacli"): ssacli and,
    after ``import ssacli``, the Auto classes load it with its scorer. Layout 1 (model_type
    ssacli-llama, the real type beside it): ssacli reads it as before; plain transformers refuses
    it, registration or not."""
    import shutil

    expected = reference_logits(folders["recipe"])
    previous = tmp_path / "layout2"
    shutil.copytree(folders["recipe"], previous)
    config = json.loads((previous / "config.json").read_text())
    config["model_type"] = config.pop(ORIGINAL_TYPE_KEY)
    (previous / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    assert saved_config(previous).model_type == "llama"
    torch.testing.assert_close(reference_logits(previous), expected, rtol=0, atol=0)
    plain = AutoModelForCausalLM.from_pretrained(previous, dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(plain(torch.tensor(IDS), use_cache=False).logits, expected)
    assert ssacli.scorers_of(plain)

    old = tmp_path / "layout1"
    shutil.copytree(previous, old)
    for key in (ATTENTION_KEY, LAYOUT_KEY):
        config.pop(key)
    config.update({"model_type": "ssacli-llama", ORIGINAL_TYPE_KEY: "llama"})
    (old / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    assert saved_config(old).model_type == "llama"
    torch.testing.assert_close(reference_logits(old), expected, rtol=0, atol=0)
    for load in (AutoModelForCausalLM.from_pretrained, AutoConfig.from_pretrained):
        with pytest.raises(ValueError, match="ssacli-llama"):
            load(old)


def test_ssacli_save_model_writes_a_plain_loaded_model_with_its_scorers_and_the_guard(folders, tmp_path):
    model = GPT2LMHeadModel.from_pretrained(folders["gpt2"]).eval()  # never run: no scorer attached yet
    out = ssacli.save_model(model, tmp_path / "again")
    config = json.loads((out / "config.json").read_text())
    guard = (config[ATTENTION_KEY], config["model_type"], config[ORIGINAL_TYPE_KEY])
    assert guard == ("ssacli", guarded_type("gpt2"), "gpt2")
    assert config[LAYOUT_KEY] == {"GPT2Attention": "transformer.h.{layer}.attn"}
    torch.testing.assert_close(reference_logits(out), reference_logits(folders["gpt2"]), rtol=0, atol=0)
