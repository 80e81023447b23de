"""Models larger than one device (--device-map, --max-memory): a tiny llama whose CPU budget forces
some layers onto the disk is measured, converted and written exactly as the same model loaded
whole (the reference: the model in memory, no accelerate hooks)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import tempfile

import pytest
import torch
from safetensors.torch import load_file

import ssacli
from ssacli.attention.interface import execution_device, scorers_of
from ssacli.errors import UsageError
from ssacli.models.device_map import OFFLOAD_PREFIX, parse_max_memory
from ssacli.models.loading import load_model
from tests.helpers.cli import run_main
from tests.helpers.models import build_model

pytest.importorskip("accelerate")

LAYERS = 4
RUN = {"probes": ["outlier:1,100", "logit-scale:1,8"], "random_ids": True, "samples": 2, "length": 12}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    build_model("llama", num_hidden_layers=LAYERS).save_pretrained(folder)
    return folder


def cpu_budget(folder) -> int:
    """Bytes of CPU memory that hold the embeddings and about two decoder layers: accelerate keeps
    room for the largest layer when it offloads, so the first layer stays on the CPU, the rest go
    to the disk."""
    model = build_model("llama", num_hidden_layers=LAYERS)
    size = lambda module: sum(p.numel() * p.element_size() for p in module.parameters())  # noqa: E731
    return int(size(model.model.embed_tokens) + 2.5 * size(model.model.layers[0]))


def placed(folder, **options):
    return load_model(str(folder), device_map="auto", max_memory={"cpu": cpu_budget(folder)}, **options)


def layer_places(loaded) -> dict[int, str]:
    """Where each decoder layer is, from hf_device_map (a block may name the whole layers list)."""
    found = {}
    for name, where in loaded.model.hf_device_map.items():
        if name == "model.layers":
            found.update(dict.fromkeys(range(LAYERS), where))
        elif name.startswith("model.layers."):
            found[int(name.split(".")[2])] = where
    return found


def assert_same_result(a, b, atol=1e-6):
    """Every number of two diagnose results equal within ``atol`` (absolute), everything else equal;
    the run time and where the model was placed aside."""

    def walk(x, y, path):
        if isinstance(x, dict):
            assert x.keys() == y.keys(), path
            for key in x:
                walk(x[key], y[key], f"{path}.{key}")
        elif isinstance(x, list):
            assert len(x) == len(y), path
            for i, (u, v) in enumerate(zip(x, y)):
                walk(u, v, f"{path}[{i}]")
        elif isinstance(x, float) and isinstance(y, float):
            assert (x != x and y != y) or abs(x - y) <= atol, (path, x, y)
        else:
            assert x == y, (path, x, y)

    da, db = a.to_dict(), b.to_dict()
    for d in (da, db):
        d.pop("elapsed_s", None)
        d["settings"].pop("device_map", None)
    walk(da, db, "result")
    assert sum(isinstance(v, float) for v in _leaves(da)) > 100  # the comparison saw the metrics


def _leaves(data):
    if isinstance(data, dict):
        for v in data.values():
            yield from _leaves(v)
    elif isinstance(data, list):
        for v in data:
            yield from _leaves(v)
    else:
        yield data


def test_budget_offloads_some_layers_to_disk(tiny_dir):
    loaded = placed(tiny_dir)
    places = layer_places(loaded)
    assert set(places) == set(range(LAYERS))
    assert "cpu" in places.values() and "disk" in places.values(), places
    on_meta = [n for n, p in loaded.model.named_parameters() if p.device.type == "meta"]
    assert on_meta, "disk-offloaded weights should wait on 'meta' until their layer runs"
    assert loaded.device == torch.device("cpu")


def test_offloaded_diagnose_equals_the_model_in_memory(tiny_dir):
    whole = ssacli.diagnose(str(tiny_dir), **RUN)
    loaded = placed(tiny_dir)
    offloaded = ssacli.diagnose(loaded, **RUN)
    assert_same_result(whole, offloaded)
    assert offloaded.settings["device_map"] == loaded.model.hf_device_map
    assert "device_map" not in whole.settings
    assert any(p.device.type == "meta" for p in loaded.model.parameters())  # still offloaded after


def test_diagnose_api_options_load_the_same_placement(tiny_dir):
    budget = f"cpu={cpu_budget(tiny_dir)}"
    result = ssacli.diagnose(str(tiny_dir), device_map="auto", max_memory=budget, **RUN)
    assert "disk" in result.settings["device_map"].values()
    assert_same_result(ssacli.diagnose(str(tiny_dir), **RUN), result)


def test_converted_model_offloaded_equals_whole_and_scorers_sit_on_their_layer(tiny_dir, tmp_path):
    out = tmp_path / "ssa"
    ssacli.convert(str(tiny_dir), "ssa", out)  # default SSA: not softmax, its b and n per head matter
    whole = ssacli.diagnose(str(out), **RUN)
    loaded = placed(out)
    assert "disk" in layer_places(loaded).values()
    scorers = scorers_of(loaded.model)
    assert len(scorers) == LAYERS
    for name, scorer in scorers.items():
        devices = {p.device for p in scorer.parameters()}
        assert devices == {execution_device(loaded.model, name)} == {torch.device("cpu")}, name
    assert_same_result(whole, ssacli.diagnose(loaded, **RUN))
    softmax = ssacli.diagnose(str(tiny_dir), **RUN)
    top = lambda r: r.probes[1].metrics["max_weight"]  # noqa: E731  (logit-scale)
    assert abs(top(softmax) - top(whole)).max() > 1e-3  # the scorer is in what was compared


def test_convert_of_an_offloaded_model_writes_the_same_checkpoint(tiny_dir, tmp_path):
    a, b = tmp_path / "whole", tmp_path / "offloaded"
    _, report_a = ssacli.convert(str(tiny_dir), "ssa:init=faithful", a)
    loaded = placed(tiny_dir)
    assert "disk" in layer_places(loaded).values()
    _, report_b = ssacli.convert(loaded, "ssa:init=faithful", b)
    assert report_a["kl_per_token"] < 1e-3 and report_a == report_b  # same calibration, same m, same KL
    files = sorted(p.name for p in a.iterdir())
    assert files == sorted(p.name for p in b.iterdir())
    weights = [f for f in files if f.endswith(".safetensors")]
    assert "model.safetensors" in weights and "ssacli_scorer.safetensors" in weights
    for name in weights:
        ta, tb = load_file(a / name), load_file(b / name)
        assert ta.keys() == tb.keys(), name
        for key in ta:
            assert tb[key].device.type == "cpu" and torch.equal(ta[key], tb[key]), (name, key)
    for name in ("config.json", "ssacli.json"):
        assert json.loads((a / name).read_text()) == json.loads((b / name).read_text())
    # convert places a MODEL reference itself, as diagnose does (LoadOptions' device_map, max_memory)
    c = tmp_path / "placed-by-convert"
    budget = f"cpu={cpu_budget(tiny_dir)}"
    converted, report_c = ssacli.convert(
        str(tiny_dir), "ssa:init=faithful", c, device_map="auto", max_memory=budget
    )
    assert "disk" in layer_places(converted).values() and report_c == report_a
    for name in weights:
        ta, tc = load_file(a / name), load_file(c / name)
        assert ta.keys() == tc.keys() and all(torch.equal(ta[k], tc[k]) for k in ta), name


def test_cli_diagnose_and_convert_take_the_options(tiny_dir, tmp_path, monkeypatch, capsys):
    budget = f"cpu={cpu_budget(tiny_dir)}"
    out = tmp_path / "d.json"
    args = ["--random", "--samples", "2", "--length", "12", "--probe", "outlier:1,100", "-q"]
    placement = ["--device-map", "auto", "--max-memory", budget]
    argv = ["diagnose", str(tiny_dir), *args, *placement, "--json", str(out)]
    code, _, err = run_main(argv, monkeypatch, capsys)
    assert code == 0, err
    assert "disk" in json.loads(out.read_text())["settings"]["device_map"].values()
    code, _, err = run_main(
        ["convert", str(tiny_dir), "--scorer", "ssa:init=faithful", "--out", str(tmp_path / "c"),
         "--device-map", "cpu", "--max-memory", budget],
        monkeypatch, capsys,
    )  # fmt: skip
    assert code == 0, err
    assert (tmp_path / "c" / "ssacli_scorer.safetensors").is_file()


def test_max_memory_values():
    assert parse_max_memory("cpu=200MB, 0=1GiB") == {"cpu": 200 * 10**6, 0: 2**30}
    assert parse_max_memory(["cpu=1.5GB", "cuda:1=4096"]) == {"cpu": 15 * 10**8, 1: 4096}
    assert parse_max_memory({"cpu": "2KiB"}) == {"cpu": 2048}
    assert parse_max_memory(None) is None


BAD = [
    (["--device-map", "everywhere"], "unknown --device-map 'everywhere'"),
    (["--device-map", "auto", "--max-memory", "cpu=lots"], "--max-memory cpu=lots: not a size"),
    (["--device-map", "auto", "--max-memory", "cpu"], "--max-memory takes DEVICE=SIZE"),
    (["--device-map", "auto", "--max-memory", "cpu=0MB"], "more than 0 bytes"),
    (["--device-map", "auto", "--max-memory", "tpu=1GB"], "unknown device 'tpu'"),
    (["--device-map", "auto", "--max-memory", "cpu=1GB,cpu=2GB"], "gives cpu twice"),
    (["--device-map", "auto", "--max-memory", "7=1GB"], "--max-memory 7=…"),
    (["--device-map", "cpu", "--max-memory", "0=1GB"], "--device-map cpu uses none"),
    (["--max-memory", "cpu=1GB"], "give --device-map auto with it"),
    (["--device-map", "auto", "--device", "cpu"], "give one"),
]


@pytest.mark.badinput
@pytest.mark.parametrize("extra,message", BAD, ids=[" ".join(b[0]) for b in BAD])
@pytest.mark.parametrize("command", ["diagnose", "convert"])
def test_bad_values_are_one_line_exit_2(command, extra, message, tiny_dir, tmp_path, monkeypatch, capsys):
    if "7=1GB" in extra and torch.cuda.device_count() > 7:
        pytest.skip("this machine has 8 GPUs")
    out = tmp_path / "out"
    tail = ["--scorer", "ssa", "--out", str(out)] if command == "convert" else ["--random", "--samples", "1"]
    code, _, err = run_main([command, str(tiny_dir), *tail, *extra], monkeypatch, capsys)
    assert code == 2, err
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.badinput
def test_finetune_refuses_a_device_map(tiny_dir, tmp_path, monkeypatch, capsys):
    data = tmp_path / "t.txt"
    data.write_text("some text " * 50)
    args = ["convert", str(tiny_dir), "--scorer", "ssa", "--out", str(tmp_path / "o"), "--finetune"]
    code, _, err = run_main([*args, "--data", str(data), "--device-map", "auto"], monkeypatch, capsys)
    assert code == 2 and "applies to convert without --finetune" in err


@pytest.mark.badinput
def test_missing_accelerate_names_the_extra(tiny_dir, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "accelerate", None)  # import accelerate fails, find_spec: None
    with pytest.raises(UsageError, match=r"ssacli\[big\]"):
        load_model(str(tiny_dir), device_map="auto")
    code, _, err = run_main(["diagnose", str(tiny_dir), "--device-map", "auto"], monkeypatch, capsys)
    assert code == 2 and 'pip install "ssacli[big]"' in err and "Traceback" not in err


def test_offload_folder_is_owned_and_removed(tmp_path, monkeypatch):
    """Pickle weights are copied to the offload folder (safetensors are read in place): it lives
    while the model does, goes with it, and one left by a dead process goes at the next load."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"{OFFLOAD_PREFIX}{dead.pid}-left"
    stale.mkdir()
    (stale / "w.safetensors").write_bytes(b"x")
    keep = tmp_path / f"{OFFLOAD_PREFIX}notapid-x"
    keep.mkdir()
    source = build_model("llama", num_hidden_layers=LAYERS)
    folder = tmp_path / "pickled"
    source.config.architectures = ["LlamaForCausalLM"]
    source.config.save_pretrained(folder)
    torch.save(source.state_dict(), folder / "pytorch_model.bin")
    loaded = placed(folder, allow_pickle=True)
    assert not stale.exists() and keep.exists()
    ours = [p for p in tmp_path.glob(OFFLOAD_PREFIX + "*") if p != keep]
    assert len(ours) == 1 and any(ours[0].iterdir())
    ids = torch.randint(3, 128, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(loaded.model(ids).logits, source(ids).logits, rtol=1e-5, atol=1e-6)
    del loaded
    gc.collect()
    assert not ours[0].exists()
