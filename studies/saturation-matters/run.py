"""Issue 52's study on SmolLM2-135M-Instruct (docs/results/saturation-matters-plan.md, fixed before
any run): per probe of the plan, ssacli.attribute at its shifted level (16 WikiText-2 test prompts of
256 tokens, seed 0, top 4 heads by collapse rise chosen on one half and measured on the other, 200
layer-matched random sets, each head alone, every head). One JSON per probe under --out; a probe
whose JSON exists is skipped (resumable: kill and rerun).

    python scripts/dequantize_smollm2.py GGUF runs/smollm2-135m-instruct
    python studies/saturation-matters/run.py runs/smollm2-135m-instruct ../shared/data/wikitext2/test.txt \
        --out docs/results/saturation-matters
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import ssacli  # noqa: E402

# The plan's probes in its order: the primary endpoint first.
PROBES = ("key-scale:1,8", "logit-scale:1,4", "dominant-key:0,8", "length:1,4")


def done(target: Path, name: str) -> bool:
    """A part whose record exists is skipped (the runs are resumable: kill and rerun)."""
    if target.exists():
        print(f"{name}: done already ({target})", flush=True)
    return target.exists()


def save(target: Path, record: dict) -> None:
    """Write a record whole or not at all (a killed run leaves only a .part behind)."""
    part = target.with_suffix(".json.part")
    part.write_text(json.dumps(record, indent=1) + "\n")
    part.replace(target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("text", help="the reference text (WikiText-2 test)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--probes", nargs="*", default=list(PROBES))
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--null", type=int, default=200)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = ssacli.load_model(args.model)
    text = Path(args.text).read_text(encoding="utf-8")  # text= takes the text itself, not its path
    for probe in args.probes:
        name = probe.split(":")[0]
        target = args.out / f"{name}.json"
        if done(target, name):
            continue
        started = time.perf_counter()
        result = ssacli.attribute(model, probe, text=text, samples=args.samples, length=args.length,
                                  seed=0, k=4, null=args.null)  # fmt: skip
        record = {"probe": probe, "model": args.model, "text": args.text,
                  "seconds": round(time.perf_counter() - started, 1),
                  "threads": os.environ.get("OMP_NUM_THREADS"), **result.to_dict()}  # fmt: skip
        save(target, record)
        print(f"{name}: {record['seconds']} s", flush=True)
        print("\n".join(result.lines()), flush=True)


if __name__ == "__main__":
    main()
