"""What ``ssacli.attribute`` costs as a multiple of a plain ``ssacli.diagnose`` of the same probe and
prompts, measured side by side in one run (machines here are noisy: read the multiples, not the
seconds). Not part of the test suite.

    python benchmarks/attribution.py [--model builtin:wikitext-softmax] [--probe key-scale:1,8]
        [--samples 16] [--length 64] [--repeats 7] [--null 200] [--default-repeats 1 (0: skip it)]
        [--threads 1]

The model is loaded once; every candidate gets the loaded model, the same probe and prompts:

* ``diagnose``: ``ssacli.diagnose(model, [probe], samples=…, length=…)`` (its defaults: fused
  statistics where they apply);
* ``one set``: ``ssacli.attribute`` with one given set (``heads=[…]``: the first --k heads of the last
  layer), ``null=0, per_head=False, ceiling=False``: the unshifted and shifted levels, then one patched
  pass per level — the issue's goal is at most GOAL × diagnose;
* ``two chosen sets``: no ``heads``: the top --k chosen on each half, measured on the other (no null,
  no parts, no ceiling);
* ``the default``: ``ssacli.attribute(model, probe)`` with ``null=--null`` (200), per head, ceiling.

The first three are timed in interleaved rounds (one untimed warm-up each; best and median of
--repeats rounds, ``_common``'s rule); the default, which costs about 2 × (1 + null + k) patched
half-passes, --default-repeats times after them, each beside a diagnose of its own round.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

GOAL = 3.0  # one patched set per level <= 3 x a plain diagnose of the same probe (issue 52, item 6)


def rounds(fns: dict, repeats: int) -> dict[str, list[float]]:
    """Each function's seconds in ``repeats`` interleaved rounds, after one untimed call each."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="builtin:wikitext-softmax")
    parser.add_argument("--probe", default="key-scale:1,8")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--length", type=int, default=None)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--null", type=int, default=200)
    parser.add_argument("--default-repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    # one thread by default: on a shared 2-core machine torch's two threads stall against another
    # process's (the default null measured 281 s with two, 20 s with one; docs/performance.md)
    torch.set_num_threads(args.threads)

    import ssacli

    loaded = ssacli.load_model(args.model)
    prompts = {"samples": args.samples, "length": args.length}
    last = len(list(ssacli.attention_modules(loaded.model))) - 1
    heads = [(last, h) for h in range(args.k)]

    def diagnose():
        return ssacli.diagnose(loaded, [args.probe], **prompts)

    def one_set():
        return ssacli.attribute(
            loaded, args.probe, heads=heads, null=0, per_head=False, ceiling=False, **prompts
        )

    def chosen():
        return ssacli.attribute(
            loaded, args.probe, k=args.k, null=0, per_head=False, ceiling=False, **prompts
        )

    def default():
        return ssacli.attribute(loaded, args.probe, k=args.k, null=args.null, **prompts)

    times = rounds({"diagnose": diagnose, "one set": one_set, "two chosen sets": chosen}, args.repeats)
    base_default: list[float] = []
    if args.default_repeats:  # 0: not timed (tests/contracts/test_benchmarks.py's tiny run)
        times["the default"] = []
    for _ in range(args.default_repeats):
        for name, fn, into in (("diagnose", diagnose, base_default), ("the default", default, None)):
            start = time.perf_counter()
            fn()
            (into if into is not None else times[name]).append(time.perf_counter() - start)

    length = one_set().settings["length"]
    cpu = platform.processor() or platform.machine()
    print(f"{args.model}, {args.probe}, {args.samples} prompts x {length} tokens; torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads, {cpu}")  # fmt: skip
    best_diagnose, median_diagnose = min(times["diagnose"]), statistics.median(times["diagnose"])
    labels = {
        "diagnose": f"ssacli.diagnose(model, ['{args.probe}'])",
        "one set": f"one given set ({len(heads)} heads), null=0, no parts, no ceiling",
        "two chosen sets": "two chosen sets (A->B, B->A), null=0, no parts, no ceiling",
        "the default": f"the default (k={args.k}, null={args.null}, per head, ceiling)",
    }
    print(f"{'run':<62} {'best s':>8} {'median s':>9} {'x diagnose':>11} {'x median':>9}")
    for name, values in times.items():
        base = min(base_default) if name == "the default" else best_diagnose
        base_median = statistics.median(base_default) if name == "the default" else median_diagnose
        print(f"{labels[name]:<62} {min(values):8.3f} {statistics.median(values):9.3f} "
              f"{min(values) / base:11.2f} {statistics.median(values) / base_median:9.2f}")  # fmt: skip
    multiple = min(times["one set"]) / best_diagnose
    verdict = "met" if multiple <= GOAL else "NOT met"
    print(f"goal: one patched set per level <= {GOAL:g} x diagnose: {multiple:.2f} x diagnose, {verdict}")
    if args.default_repeats:
        print("(the default's multiple is against the diagnose timed beside it, in its own rounds)")


if __name__ == "__main__":
    main()
