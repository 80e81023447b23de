"""Issue 52's secondary endpoint on SmolLM2-135M-Instruct (docs/results/saturation-matters-plan.md):
per document, the saturation change against the output damage, with Spearman's ρ and its bootstrap
interval over documents.

* Natural shifts (``ssacli.diagnose(..., text=WikiText-2 test, shift=CORPUS)``): another domain
  (tinyshakespeare), code (Python's own standard-library sources: argparse, json, csv, as installed)
  and long numbers (arithmetic lines with 6–14-digit operands, written here from seed 0), 32
  documents of 256 tokens per corpus. Their damage is a loss increase, which mixes the corpus's own
  difficulty with damage (docs/diagnose.md, "Natural shifts").
* The synthetic probes of run.py, on the same 16 prompts (``ssacli.attribute`` with no null: only
  the per-prompt collapse and damage it keeps, ``association``).

One JSON per part under --out (skipped where it exists: resumable).

    python studies/saturation-matters/secondary.py runs/smollm2-135m-instruct \
        ../shared/data/wikitext2/test.txt ../shared/data/tinyshakespeare.txt \
        --out docs/results/saturation-matters
"""

from __future__ import annotations

import argparse
import inspect
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import ssacli  # noqa: E402
from ssacli.diagnosis.verdicts import probe_verdicts  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import PROBES, done, save  # noqa: E402  (the plan's probes, in its order; resumable records)

DOCUMENTS, LENGTH = 32, 256


def code_corpus() -> str:
    """Python source: three standard-library modules of the running interpreter."""
    import argparse as a
    import csv
    import json as j

    return "\n\n".join(inspect.getsource(m) for m in (a, j.decoder, j.encoder, csv))


def numbers_corpus(lines: int = 4000, seed: int = 0) -> str:
    """Arithmetic with long operands: "48213957 + 902837465 = 951051422 ." one per line."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(lines):
        a, b = (int(rng.integers(10 ** int(rng.integers(5, 14)), 10**14)) for _ in range(2))
        op = "+" if rng.random() < 0.5 else "-"
        out.append(f"{a} {op} {b} = {a + b if op == '+' else a - b} .")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("text", help="the reference text (WikiText-2 test)")
    parser.add_argument("shakespeare", help="tinyshakespeare.txt")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = ssacli.load_model(args.model)
    reference = Path(args.text).read_text(encoding="utf-8")
    corpora = {"shakespeare": Path(args.shakespeare).read_text(encoding="utf-8"), "code": code_corpus(),
               "numbers": numbers_corpus()}  # fmt: skip
    for name, corpus in corpora.items():
        target = args.out / f"natural-{name}.json"
        if done(target, f"natural {name}"):
            continue
        started = time.perf_counter()
        result = ssacli.diagnose(model, ["shift"], text=reference, shift=corpus, shift_name=name,
                                 samples=DOCUMENTS, length=LENGTH, seed=0)  # fmt: skip
        summary = result.to_dict()["probes"][0]["summary"]["shift"]
        verdicts = [v.line for v in probe_verdicts(result)]
        save(target, {"corpus": name, "model": args.model, "seconds": round(time.perf_counter() - started, 1),
                      "summary": summary, "verdicts": verdicts})  # fmt: skip
        print(f"natural {name}: rho {summary['association']}", flush=True)
    for probe in PROBES:
        name = probe.split(":")[0]
        target = args.out / f"per-prompt-{name}.json"
        if done(target, f"per prompt {name}"):
            continue
        started = time.perf_counter()
        result = ssacli.attribute(model, probe, text=reference, samples=16, length=LENGTH, seed=0, k=4,
                                  null=0, per_head=False, ceiling=False)  # fmt: skip
        save(target, {"probe": probe, "seconds": round(time.perf_counter() - started, 1),
                      "damage": result.damage, "collapse_reference": result.collapse_reference,
                      "collapse_shifted": result.collapse_shifted, "association": result.association,
                      "loss_reference": result.loss_reference})  # fmt: skip
        print(f"per prompt {name}: {result.association}", flush=True)


if __name__ == "__main__":
    main()
