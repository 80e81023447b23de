"""Learning curves of ICL training: in-distribution error every K steps, to size a study's budget.

    python studies/icl-v3/curve.py --task linear --scorer softmax --steps 3000 --every 250 \
        --lr 1e-3 --out runs/icl-curve --results docs/results/icl-v3/curves.json

One run per (task, scorer, seed), trained in segments of --every steps with ``ssacli.icl.train``
(``resume=True``: a resumed run is the same run, tests/icl/test_icl.py), each segment's checkpoint
evaluated in distribution (σ = 1, the trained length, --prompts fresh prompts from a fixed seed) by
``ssacli.icl.evaluate``. ``linear`` reports MSE / Var(y) (0.5 is what predicting the prompt's
running mean scores; the issue's floor is <= 0.1), the quantification tasks the error rate.
Resumable: a (task, scorer, seed, step) already in --results is skipped, and so is its training.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ssacli.icl.evaluate import evaluate
from ssacli.icl.train import TrainConfig, train
from ssacli.models.icl import load_icl


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", required=True)
    parser.add_argument("--scorer", default="softmax")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--every", type=int, default=250)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--prompts", type=int, default=500)
    parser.add_argument("--length", type=int, default=41)
    parser.add_argument("--arch", default="gpt2", help="backbone: gpt2 or attn-only")
    parser.add_argument("--scorer-lr", type=float, default=None, help="the scorer's own AdamW group")
    parser.add_argument("--out", required=True)
    parser.add_argument("--results", required=True)
    args = parser.parse_args()
    results_file = Path(args.results)
    results = json.loads(results_file.read_text()) if results_file.is_file() else {"curves": {}}
    arch = "" if args.arch == "gpt2" else f"{args.arch}/"  # gpt2 keys stay as they were
    key = f"{arch}{args.task}/{args.scorer}/s{args.seed}"
    curve = results["curves"].setdefault(key, {"settings": vars(args), "points": []})
    done = {p["step"] for p in curve["points"]}
    out = Path(args.out) / key.replace("/", "-")
    for step in range(args.every, args.steps + 1, args.every):
        if step in done:
            continue
        began = time.perf_counter()
        # the whole run's schedule is --steps; each segment stops at `step` (the curriculum and
        # the learning rate follow the full run, so the curve is the one run's, not shorter runs')
        extra = {} if args.scorer_lr is None else {"scorer_lr": args.scorer_lr}
        config = TrainConfig(task=args.task, scorer=args.scorer, steps=args.steps, lr=args.lr, seed=args.seed,
                             checkpoint_every=args.every, arch=args.arch, **extra)  # fmt: skip
        train(config, out, resume=True, device="cpu", stop_at=step)
        seconds = time.perf_counter() - began
        (cell,) = evaluate(load_icl(out, "cpu"), lengths=(args.length,), prompts=args.prompts, seed=12345)
        point = {"step": step, "error": cell.error, "normalized_error": cell.normalized_error,
                 "train_seconds": round(seconds, 1)}  # fmt: skip
        curve["points"].append(point)
        results_file.parent.mkdir(parents=True, exist_ok=True)
        results_file.write_text(json.dumps(results, indent=1))
        print(key, point, flush=True)


if __name__ == "__main__":
    main()
