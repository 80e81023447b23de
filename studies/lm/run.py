"""The language-model study: tiny decoders trained from scratch as `ssacli train` trains them,
paired by seed across scorers, evaluated and aggregated with the paired statistics of ssacli.stats.

    python studies/lm/run.py --plan docs/results/lm-plan.json --out runs/lm-study --jobs 2
    python studies/lm/run.py --plan docs/results/lm-plan.json --out runs/lm-study --report docs/results/lm

Per arm (scorer) and seed, in OUT/runs/{label}-s{seed}/:

1. train, in this process: what `ssacli train --size OUT/model-config.json --data PLAN.data --scorer
   SPEC --seed SEED …` runs (the plan's `model` is written as the config; same steps, batch, tokens
   and tokenizer for every arm: the tokenizer depends only on the data and the vocabulary size).
   Resumable: a finished run (its training record at the plan's steps) is skipped, an interrupted one
   continues.
2. evaluate (eval.json): perplexity of the in-distribution text (`id_text`) and the out-of-
   distribution text (`ood_text`) at the training context and at each multiple in `contexts`
   (windows longer than the trained positions: RoPE models run them, that is the length-shift
   test), the BLiMP paradigms in `blimp` (accuracy per paradigm and their mean), and `ssacli
   diagnose` of the model (diagnose.json; its collapse summary per probe). Skipped when eval.json is
   there and the training is finished.
3. aggregate (results.json): every metric per run, mean ± std per arm, and each arm against the
   plan's `reference` paired by seed (per-seed differences, bootstrap 95 % CI, sign-flip
   permutation test, paired t-test, sign test; ssacli.stats).

`--report DIR` also writes DIR/tables.md and the figures (after the runs; finished ones are skipped);
`--report DIR --from-results FILE` renders a results.json already written, without running
anything (its pairs are recomputed from its runs, so files written before a test existed render
with it).
Paths in the plan are relative to the current directory (the repository root for the committed
plan, which reads ../shared/data).

The study itself is ssacli.quality.lm_study (on the study engine, ssacli.study); the report is
ssacli.report.lm_study. This file is only their command line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ssacli.errors import SsacliError


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--report", type=Path, help="write tables.md and figures here from results.json")
    parser.add_argument(
        "--from-results", type=Path, help="with --report: render this results.json, run nothing"
    )
    args = parser.parse_args(argv)
    if not args.from_results and (args.plan is None or args.out is None):
        raise SystemExit("--plan and --out are needed (unless --report DIR --from-results FILE)")
    from ssacli.report.lm_study import write_report

    if args.from_results:
        if not args.report:
            raise SystemExit("--from-results needs --report DIR")
        print(f"wrote {write_report(json.loads(args.from_results.read_text()), args.report)}")
        return
    from ssacli.quality.lm_study import run_study

    try:
        results = run_study(args.plan, args.out, jobs=args.jobs, device=args.device)  # finished: skipped
    except SsacliError as err:
        raise SystemExit(str(err)) from None
    if args.report:
        print(f"wrote {write_report(results, args.report)}")


if __name__ == "__main__":
    main()
