"""What ``ssacli diagnose`` costs on a real checkpoint: loading, each probe level, each decoder layer.
Not part of the test suite; the figures are in docs/performance.md (real models) and
docs/diagnose.md (the Gemma 3 worked example).

    MALLOC_MMAP_THRESHOLD_=131072 python benchmarks/real_model.py MODEL [--sections load,levels,layers]
        [--dtype float32] [--length 64] [--samples 8] [--batch-size 8] [--probe SPEC ...]
        [--device-map cpu --max-memory cpu=300MB] [--repeats 3] [--json OUT] [--result RESULT.json]

load: seconds of ``ssacli.load_model`` and the process RSS after it (and its high-water mark).
levels: one ``ssacli.diagnose`` of the given probes (default: diagnose's defaults) with a progress
callback; each probe level's seconds (from the previous level's last batch to its own last batch,
so the first level also holds the run's planning and each level the previous one's tabulation) and
its peak RSS (the kernel's high-water mark, reset at each level boundary through
/proc/self/clear_refs; benchmarks/_common.py), whole-process and over the RSS before diagnose.
layers: per decoder layer, the seconds of one forward through it inside diagnose (probe
``embed-scale:1``: the forward with ssacli's attention statistics) and in a plain forward of the same
batch (the model as loaded: eager attention), best of --repeats; its weights in bytes; and what the
rest of the call (embeddings, head, loss, tabulation) took.

Run with MALLOC_MMAP_THRESHOLD_=131072 (each tensor over 128 KiB is its own mapping, returned when
freed) so that RSS follows live tensors rather than glibc's cache (benchmarks/_common.py); the
ssacli command itself runs with glibc's defaults, so its whole-run peak (``/usr/bin/time -v``) can
be higher.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from pathlib import Path

import torch
from _common import reset_peak, status_kb
from torch import nn

import ssacli

SETTINGS = ("dtype", "length", "samples", "batch_size", "device_map", "max_memory")


def mb(kb: int) -> float:
    return round(kb / 1024, 1)


def shape(config) -> dict:
    """What benchmarks/envelope.py scales by: layers, hidden size, heads, vocabulary."""
    return {
        "layers": config.num_hidden_layers, "hidden": config.hidden_size,
        "heads": config.num_attention_heads, "vocab": config.vocab_size,
    }  # fmt: skip


def on_cpu(args) -> dict:
    """device="cpu", unless --device-map places the model (the two are exclusive)."""
    return {} if args.device_map else {"device": "cpu"}


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The model's stack of decoder blocks: the longest ModuleList (model.layers, h, …)."""
    stacks = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    return max(stacks, key=len)


def timed_layers(layers: nn.ModuleList) -> tuple[list[list[tuple[float, float]]], list]:
    """Hooks that append each layer's forward (wall, process CPU) seconds to durations[layer]."""
    durations: list[list[tuple[float, float]]] = [[] for _ in layers]
    started: dict[int, tuple[float, float]] = {}
    handles = []
    for i, layer in enumerate(layers):

        def before(_m, _a, i=i):
            started[i] = (time.perf_counter(), time.process_time())

        def after(_m, _a, _o, i=i):
            wall, cpu = started.pop(i)
            durations[i].append((time.perf_counter() - wall, time.process_time() - cpu))

        handles += [layer.register_forward_pre_hook(before), layer.register_forward_hook(after)]
    return durations, handles


def load_section(args) -> tuple[object, dict]:
    gc.collect()
    before = status_kb("VmRSS")
    reset_peak()
    began = time.perf_counter()
    loaded = ssacli.load_model(
        args.model, dtype=args.dtype, device_map=args.device_map, max_memory=args.max_memory, **on_cpu(args)
    )
    seconds = time.perf_counter() - began
    gc.collect()
    model = loaded.model
    params = sum(p.numel() for p in model.parameters())
    bytes_ = sum(p.numel() * p.element_size() for p in model.parameters() if p.device.type != "meta")
    record = {
        "seconds": round(seconds, 1), "rss_before_mb": mb(before), "rss_after_mb": mb(status_kb("VmRSS")),
        "peak_mb": mb(status_kb("VmHWM")), "parameters": params,
        "weights_in_ram_mb": round(bytes_ / 2**20, 1),
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "layers": len(decoder_layers(model)), "family": loaded.family, "shape": shape(loaded.config),
    }  # fmt: skip
    return loaded, record


def levels_section(loaded, args) -> dict:
    marks = {"last": 0.0, "cpu": 0.0}
    levels: dict[str, dict] = {}

    def on_progress(what: str, done: int, total: int) -> None:
        now, cpu = time.perf_counter(), time.process_time()
        level = levels.setdefault(what, {"seconds": 0.0, "cpu_s": 0.0, "batches": 0, "peak_mb": 0.0})
        level["seconds"] += now - marks["last"]
        level["cpu_s"] += cpu - marks["cpu"]
        level["batches"] += 1
        level["peak_mb"] = max(level["peak_mb"], mb(status_kb("VmHWM")))
        reset_peak()
        marks["last"], marks["cpu"] = time.perf_counter(), time.process_time()  # not the level's time

    gc.collect()
    before = status_kb("VmRSS")
    reset_peak()
    marks["last"], marks["cpu"] = began, cpu_began = time.perf_counter(), time.process_time()
    result = ssacli.diagnose(
        loaded, args.probe or None, samples=args.samples, length=args.length, batch_size=args.batch_size,
        progress=on_progress, **on_cpu(args),
    )  # fmt: skip
    total, cpu_total = time.perf_counter() - began, time.process_time() - cpu_began
    if args.result:  # the result itself, for `ssacli render` (its verdict and tables)
        Path(args.result).write_text(result.to_json())
    for level in levels.values():
        level["seconds"], level["cpu_s"] = round(level["seconds"], 2), round(level["cpu_s"], 2)
        level["over_loaded_mb"] = round(level["peak_mb"] - mb(before), 1)
    return {
        "seconds": round(total, 1), "cpu_s": round(cpu_total, 1), "elapsed_s": result.to_dict()["elapsed_s"],
        "rss_before_mb": mb(before),
        "peak_mb": max(v["peak_mb"] for v in levels.values()), "levels": levels,
    }  # fmt: skip


def layers_section(loaded, args) -> dict:
    model = loaded.model
    layers = decoder_layers(model)
    durations, handles = timed_layers(layers)
    ids = torch.randint(3, 1000, (args.batch_size, args.length), generator=torch.Generator().manual_seed(0))

    def diagnose_call() -> None:
        ssacli.diagnose(loaded, ["embed-scale:1"], samples=args.batch_size, length=args.length,
                        batch_size=args.batch_size, **on_cpu(args))  # fmt: skip

    def plain_call() -> None:
        with torch.inference_mode():
            model(input_ids=ids, use_cache=False)

    timings = {}
    try:
        for name, call in (("diagnose", diagnose_call), ("plain", plain_call)):
            runs = []
            for _ in range(args.repeats):
                for d in durations:
                    d.clear()
                wall, cpu = time.perf_counter(), time.process_time()
                call()
                whole = (time.perf_counter() - wall, time.process_time() - cpu)
                per_layer = [tuple(map(sum, zip(*d))) for d in durations]  # (wall, cpu) per layer
                runs.append((whole, per_layer))
            best = min(runs, key=lambda run: run[0][1])  # the run with the least CPU time
            (wall, cpu), per_layer = best
            timings[name] = {
                "call_s": round(wall, 3), "call_cpu_s": round(cpu, 3),
                "layers_s": round(sum(w for w, _ in per_layer), 3),
                "layers_cpu_s": round(sum(c for _, c in per_layer), 3),
                "layer_cpu_s": [round(c, 4) for _, c in per_layer],
            }  # fmt: skip
    finally:
        for handle in handles:
            handle.remove()
    layer_bytes = [sum(p.numel() * p.element_size() for p in layer.parameters()) for layer in layers]
    all_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return {
        "tokens": args.batch_size * args.length, "batch": args.batch_size, "length": args.length,
        "layer_parameters": sum(p.numel() for p in layers[0].parameters()),
        "layer_weights_mb": round(sum(layer_bytes) / len(layer_bytes) / 2**20, 2),
        "other_weights_mb": round((all_bytes - sum(layer_bytes)) / 2**20, 1), **timings,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model")
    parser.add_argument("--sections", default="load,levels,layers")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--probe", action="append", default=[])
    parser.add_argument("--device-map", default=None)
    parser.add_argument("--max-memory", default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="write the measurements here")
    parser.add_argument("--result", default=None, help="write the levels section's diagnose result here")
    args = parser.parse_args()
    sections = args.sections.split(",")
    record = {
        "model": args.model, "torch_threads": torch.get_num_threads(), "load_average": os.getloadavg(),
        "malloc_mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_"),
        "settings": {k: getattr(args, k) for k in SETTINGS},
    }  # fmt: skip
    loaded, record["load"] = load_section(args)
    print(json.dumps({"load": record["load"]}), flush=True)
    if "levels" in sections:
        record["levels"] = levels_section(loaded, args)
        for name, level in record["levels"]["levels"].items():
            seconds, cpu, peak, over = (level[k] for k in ("seconds", "cpu_s", "peak_mb", "over_loaded_mb"))
            print(f"  {name:<18} {seconds:7.2f} s {cpu:7.2f} cpu-s  peak {peak:8.1f} MB (+{over:.1f})")
        print(json.dumps({k: v for k, v in record["levels"].items() if k != "levels"}), flush=True)
    if "layers" in sections:
        record["layers"] = layers_section(loaded, args)
        print(json.dumps(record["layers"]), flush=True)
    record["load_average_after"] = os.getloadavg()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
