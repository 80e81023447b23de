"""Training speed with the fused attention path (the default) against the eager scorer, in one run.
Not part of the test suite; compare the ratios, not the seconds.

    python benchmarks/training.py [--steps 30] [--rounds 2] [--data ../shared/data/tinyshakespeare.txt]

Two jobs, each run with ``attention="eager"`` and ``attention="auto"`` (fused) in interleaved rounds
from identical starting weights and seeds (so both compute the same steps):

* ICL training (``ssacli icl train``): task every, SSA, the cpu preset (3 layers, 4 heads, width
  32), 64 prompts of 41 points (82 tokens) per step.
* Fine-tuning (``ssacli train`` / ``ssacli finetune``, same loop): a from-scratch tiny GPT-2 with SSA
  (2 layers, 4 heads, width 64, 256 positions) on --data, batch 8 x 256 tokens.

``--crossover 32,64,128,256,512``: instead, fine-tuning rates of the LM study's model (Llama 4 layers
× 4 heads × 128, batch 16, SSA, trained on --data) at each sequence length, eager against fused:
where ``--attention auto`` should switch from the eager scorer to the blocked kernel when training.

The first --warmup steps of each run are left out of the rate (compilation of the block kernels on
first use). Rates are steps/s (ICL) and tokens/s (fine-tuning); the best round of each.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import tempfile
import time
from pathlib import Path

import torch

from ssacli.icl.train import TrainConfig, train
from ssacli.train.finetune import FinetuneConfig, finetune
from ssacli.train.scratch import new_model, training_texts

BACKENDS = ("eager", "auto")


def icl_rate(backend: str, steps: int, warmup: int) -> float:
    """Steps per second of ICL training after ``warmup`` steps."""
    marks = []
    config = TrainConfig(
        task="every", scorer="ssa", steps=steps, batch_size=64, points_start=41, points_end=41,
        checkpoint_every=10**9, attention=backend,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        train(config, Path(tmp) / "run", device="cpu", on_step=lambda *_: marks.append(time.perf_counter()))
    return (len(marks) - 1 - warmup) / (marks[-1] - marks[warmup])


def finetune_rate(loaded, data: str, backend: str, steps: int, warmup: int, batch_size: int = 8) -> float:
    """Tokens per second of fine-tuning after ``warmup`` steps."""
    marks = []
    config = FinetuneConfig(
        data=data, steps=steps, batch_size=batch_size, seq_len=loaded.max_positions, lr=1e-3,
        checkpoint_every=10**9, attention=backend,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        finetune(
            copy.deepcopy(loaded), config, Path(tmp) / "run", device="cpu",
            on_step=lambda *_: marks.append(time.perf_counter()),
        )  # fmt: skip
    tokens_per_step = config.batch_size * config.seq_len
    return tokens_per_step * (len(marks) - 1 - warmup) / (marks[-1] - marks[warmup])


def crossover(lengths: list[int], data: str, args) -> None:
    """Tokens/s of fine-tuning the LM study's model at each length, eager vs fused, interleaved."""
    print("| seq_len | batch | eager tokens/s | fused tokens/s | **fused / eager** |")
    print("|---:|---:|---:|---:|---:|")
    texts = training_texts(data)
    folder = Path(tempfile.mkdtemp())
    study_model = {  # docs/results/lm-plan.json's model
        "model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
        "hidden_size": 128, "intermediate_size": 256, "tie_word_embeddings": True,
    }  # fmt: skip
    for length in lengths:
        config = folder / "config.json"
        config.write_text(json.dumps({**study_model, "max_position_embeddings": length}))
        loaded = new_model(None, str(config), "ssa", texts=texts, vocab_size=1024, seq_len=length, seed=0)
        rates = {b: [] for b in BACKENDS}
        for _ in range(args.rounds):
            for backend in BACKENDS:
                rate = finetune_rate(loaded, data, backend, args.steps, args.warmup, args.batch_size)
                rates[backend].append(rate)
        eager, fused = max(rates["eager"]), max(rates["auto"])
        row = f"| {length} | {args.batch_size} | {eager:,.0f} | {fused:,.0f} | **{fused / eager:.2f}** |"
        print(row, flush=True)


def report(title: str, unit: str, rates: dict[str, list[float]]) -> None:
    best = {backend: max(values) for backend, values in rates.items()}
    print(f"{title}: eager {best['eager']:.2f} {unit}, fused {best['auto']:.2f} {unit}")
    print(f"  speed-up fused / eager: {best['auto'] / best['eager']:.2f}x (rounds: {rates})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    default_data = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"
    parser.add_argument("--data", default=str(default_data))
    parser.add_argument("--crossover", default=None, help="comma-separated sequence lengths")
    parser.add_argument("--batch-size", type=int, default=16, help="with --crossover")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU, load {os.getloadavg()[0]:.1f}")
    if args.crossover:
        crossover([int(x) for x in args.crossover.split(",")], args.data, args)
        return
    icl = {b: [] for b in BACKENDS}
    for _ in range(args.rounds):
        for backend in BACKENDS:
            icl[backend].append(round(icl_rate(backend, args.steps, args.warmup), 2))
    report("ICL training (every, ssa, cpu preset, 64 x 82 tokens)", "steps/s", icl)
    if not Path(args.data).is_file():
        print(f"fine-tuning: skipped, no --data file at {args.data}")
        return
    loaded = new_model(
        "gpt2", "tiny", "ssa", texts=training_texts(args.data), vocab_size=1024, seq_len=256, seed=0
    )
    tuned = {b: [] for b in BACKENDS}
    for _ in range(args.rounds):
        for backend in BACKENDS:
            tuned[backend].append(round(finetune_rate(loaded, args.data, backend, args.steps, args.warmup)))
    report("fine-tuning (tiny gpt2, ssa, 8 x 256 tokens)", "tokens/s", tuned)


if __name__ == "__main__":
    main()
