"""How far SSA's n travels under each scorer learning rate in the default fine-tuning budget.

    python benchmarks/scorer_lr.py [--steps N]

One SSA head (b = 0.8 fixed) fitted to the weights of n* on fixed N(0, 3²) logits (64 rows × 32
keys), KL loss, with the optimizer every ssacli loop builds (ssacli.models.optim) and the default
schedule (FinetuneConfig: 1,000 steps, warmup, cosine to 10 %). Printed per rate: where n ends for
1.5 → 4 and 4 → 1.5, and how much n still moves over the last 10 % of steps (its jitter). The
default (ssacli.defaults.SCORER_LR) is the smallest rate that reaches both targets within 10 %.
"""

from __future__ import annotations

import argparse

import torch
from torch.nn import functional as F

from ssacli.models.optim import make_optimizer, set_lr
from ssacli.scorers import make_scorer
from ssacli.train.finetune import FinetuneConfig


def fit(n_start: float, n_target: float, scorer_lr: float, steps: int) -> tuple[float, float]:
    config = FinetuneConfig(data="x", scorer_lr=scorer_lr, steps=steps)
    logits = 3 * torch.randn(64, 32, generator=torch.Generator().manual_seed(0))
    visible = torch.ones_like(logits, dtype=torch.bool)
    with torch.no_grad():
        target = make_scorer(f"ssa:b=0.8,n={n_target},learn=none").score(logits, visible, None)
    student = make_scorer(f"ssa:b=0.8,n={n_start},learn=n")
    params = [p for p in student.parameters() if p.requires_grad]
    optimizer = make_optimizer(student, params, lr=config.lr, scorer_lr=scorer_lr)
    trace = []
    for step in range(steps):
        set_lr(optimizer, config.lr_at(step) / config.lr)
        loss = F.kl_div(
            student.score(logits, visible, None).clamp_min(1e-30).log(), target, reduction="batchmean"
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        trace.append(float(student.n.detach()))
    tail = trace[-max(1, steps // 10) :]
    return trace[-1], max(tail) - min(tail)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=FinetuneConfig(data="x").steps)
    args = parser.parse_args()
    print(f"{args.steps} steps, cosine; n after fitting (movement over the last 10 % of steps)")
    print(f"{'scorer lr':>10} | {'1.5 -> 4':>16} | {'4 -> 1.5':>16}")
    for lr in (1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1):
        up, up_tail = fit(1.5, 4.0, lr, args.steps)
        down, down_tail = fit(4.0, 1.5, lr, args.steps)
        print(f"{lr:>10g} | {up:7.3f} ({up_tail:.3f}) | {down:7.3f} ({down_tail:.3f})")


if __name__ == "__main__":
    main()
