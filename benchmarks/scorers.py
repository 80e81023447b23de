"""Time every scorer against softmax, side by side in one run (machines here are noisy: compare
ratios, not seconds). Not part of the test suite.

    python benchmarks/scorers.py [--heads 8] [--length 512] [--repeats 5]
"""

from __future__ import annotations

import argparse

import torch
from _common import interleaved_best

from ssacli.scorers import SCORERS, make_scorer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    h, t, d = args.heads, args.length, args.dim
    logits = torch.randn(1, h, t, t)
    query, key = torch.randn(1, h, t, d), torch.randn(1, h, t, d)
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    print(f"B=1 H={h} T={t} causal, fp32, {torch.get_num_threads()} threads, best of {args.repeats}")
    print(f"{'scorer':<12} {'fwd ms':>8} {'x softmax':>10} {'fwd+bwd ms':>11} {'x softmax':>10}")
    forward, train_step = {}, {}
    for name in SCORERS:
        scorer = make_scorer(name, num_heads=h)

        def fwd(scorer=scorer):
            with torch.no_grad():
                scorer(logits, mask, query=query, key=key)

        def step(scorer=scorer):
            x, q = logits.clone().requires_grad_(True), query.clone().requires_grad_(True)
            scorer(x, mask, query=q, key=key).square().sum().backward()

        forward[name], train_step[name] = fwd, step
    fwd_times = interleaved_best(forward, args.repeats)
    step_times = interleaved_best(train_step, args.repeats)
    base_f, base_s = fwd_times["softmax"], step_times["softmax"]
    for name in SCORERS:
        f, s = fwd_times[name], step_times[name]
        print(f"{name:<12} {f * 1e3:8.1f} {f / base_f:10.2f} {s * 1e3:11.1f} {s / base_s:10.2f}")


if __name__ == "__main__":
    main()
