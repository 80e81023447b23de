"""SmolLM2-135M at 2k → 8k tokens (docs/results/mechanism.md, Part A, the one slow run).

    python studies/mechanism/long.py --model runs/smollm2-135m-instruct \
        --data ../shared/data/wikitext2/test.txt --out docs/results/mechanism/smollm2-long.json

One model, so no association across models: this run gives the shape of saturation and of the
perplexity change over a length shift that stays inside the model's trained 8,192 positions (unlike
the bundled LM's, which crosses its 128), and the same intervention as Part A at that scale:

1. ``ssacli.diagnose``, the length probe at 1, 2, 4 × BASE tokens (SAMPLES held-out prompts): the
   model-mean collapse rate, max weight, sink mass and entropy per level, and per-head collapse;
2. perplexity at windows of 1, 2, 4 × BASE on the same held-out tokens (the trade-off study's
   ``perplexity``: each token is scored with the context inside its window);
3. the HEADS heads (of 270) with the highest collapse rate at 4 × BASE get softmax(x / T), and the
   perplexity at 1 × and 4 × BASE is measured again: the difference in differences
   Δ log ppl(4×) − Δ log ppl(1×) (one model: a point, no interval).

Each stage's result is written to OUT as it finishes; a rerun skips the stages OUT already holds.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
from length import LEVELS, perplexity, saturation
from mechanism_common import load, soften_heads

from ssacli.files import write_json

HEADS = 4
TEMPERATURE = 2.0


def windowed_perplexity(loaded, ids, window: int) -> float:
    """The trade-off study's perplexity, one window per forward (its batch of 8 would hold 8 × 8k ×
    49,152 float64 logits at once); every window has the same length, so the mean of the windows'
    log perplexities is the log perplexity of all of them."""
    count = len(ids) // window
    logs = [math.log(perplexity(loaded, ids[i * window : (i + 1) * window], window)) for i in range(count)]
    return math.exp(sum(logs) / len(logs))


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--base", type=int, default=2048)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=16384)
    args = parser.parse_args()
    from ssacli.train.data import TextData

    out = Path(args.out)
    record = json.loads(out.read_text()) if out.is_file() else {"settings": vars(args)}
    loaded = load(args.model)
    data = TextData.load(args.data, loaded.tokenizer)
    held = data.heldout_stream[: args.tokens]

    def stage(name: str, work) -> None:
        if name in record:
            return
        began = time.perf_counter()
        record[name] = work()
        record.setdefault("seconds", {})[name] = round(time.perf_counter() - began, 1)
        write_json(record, out)
        print(name, "done in", record["seconds"][name], "s", flush=True)

    stage("saturation", lambda: saturation(loaded, data.heldout_text, args.base, args.samples))
    stage("ppl", lambda: {f"{lv}x": windowed_perplexity(loaded, held, lv * args.base) for lv in LEVELS})
    sat = record["saturation"]
    heads4 = np.asarray(sat["collapse_rate_heads"][LEVELS.index(4)])
    weight4 = np.asarray(sat["max_weight_heads"][LEVELS.index(4)])
    order = sorted(np.ndindex(heads4.shape), key=lambda i: (-heads4[i], -weight4[i]))[:HEADS]
    heads = [(int(a), int(b)) for a, b in order]

    def softened() -> dict:
        soften_heads(loaded.model, heads, TEMPERATURE)
        after = {f"{lv}x": windowed_perplexity(loaded, held, lv * args.base) for lv in (1, 4)}
        change = {k: math.log(after[k] / record["ppl"][k]) for k in after}
        return {"heads": heads, "t": TEMPERATURE, "heads_collapse_4x": [float(heads4[h]) for h in order],
                "ppl_after": after, "did": change["4x"] - change["1x"]}  # fmt: skip

    stage("temperature", softened)
    print(json.dumps({k: record[k] for k in ("ppl", "temperature")}, indent=1))


if __name__ == "__main__":
    main()
