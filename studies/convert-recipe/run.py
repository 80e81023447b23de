"""The conversion-recipe study (docs/results/convert-recipe.md): arms × seeds on a softmax LM.

    python studies/convert-recipe/run.py --model builtin:wikitext-softmax \
        --data ../shared/data/wikitext2/valid.txt --id-text ../shared/data/wikitext2/test.txt \
        --ood-text ../shared/data/tinyshakespeare.txt --out runs/convert-recipe \
        --results docs/results/convert-recipe/results.json --seeds 0 1 2

Resumable: an (arm, seed) already in --results is skipped; each finished run is written at once.
Paired: every arm of a seed sees the same batches (the seed sets them), the same start (the same
m=auto conversion) and the same evaluation text.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from torch.nn import functional as F

import ssacli
from ssacli.models.loading import load_model
from ssacli.train.finetune import FinetuneConfig, finetune
from ssacli.train.recipe import RecipeConfig, convert_with_recipe

ARMS = {
    # name: (kind, settings)
    "recipe": ("recipe", {"b": "learned"}),
    "tied": ("recipe", {"b": "tied"}),
    "no-transfer": ("recipe", {"b": "learned", "stages": ("distill",)}),
    "anneal-finetune": ("finetune", {}),
}


@torch.no_grad()
def perplexity(model, tokenizer, text: str, tokens: int, window: int) -> float:
    """e^(mean NLL) over the first ``tokens`` scored tokens of ``text`` in ``window``-token windows."""
    ids = torch.tensor(tokenizer(text[: tokens * 12])["input_ids"])
    count = min(tokens // (window - 1), len(ids) // window)
    rows = ids[: count * window].view(count, window)
    model.eval()
    nll = []
    for batch in rows.split(8):
        logits = model(input_ids=batch, use_cache=False).logits.double()
        nll.append(F.cross_entropy(logits[:, :-1].flatten(0, 1), batch[:, 1:].flatten(), reduction="none"))
    return math.exp(float(torch.cat(nll).mean()))


def evaluate(path: str, texts: dict[str, str], args) -> dict[str, float]:
    loaded = load_model(path, dtype="float32", device="cpu")
    return {name: perplexity(loaded.model, loaded.tokenizer, text, args.eval_tokens, args.window)
            for name, text in texts.items()}  # fmt: skip


def run_arm(arm: str, seed: int, args) -> dict:
    kind, settings = ARMS[arm]
    out = Path(args.out) / f"{arm}-s{seed}"
    began = time.perf_counter()
    if kind == "recipe":
        config = RecipeConfig(
            data=args.data, target_n=args.target_n, transfer_steps=args.transfer_steps,
            distill_steps=args.distill_steps, batch_size=args.batch_size, seq_len=args.seq_len,
            seed=seed, eval_every=args.eval_every, **settings,
        )  # fmt: skip
        _, record = convert_with_recipe(args.model, out, config, overwrite=True, device="cpu")
        result = {"recipe": record}
    else:  # the plain way: faithful start, one fine-tune that anneals n linearly to the target
        loaded, _ = ssacli.convert(args.model, "ssa:init=faithful,learn=b+n", text=None, dtype="float32")
        steps = args.transfer_steps + args.distill_steps
        config = FinetuneConfig(
            data=args.data, steps=steps, batch_size=args.batch_size, seq_len=args.seq_len, seed=seed,
            anneal_n=args.target_n, checkpoint_every=steps, log_every=50,
        )  # fmt: skip
        finetune(loaded, config, out, overwrite=True, device="cpu", meta={"source": args.model})
        record = json.loads((out / "ssacli.json").read_text())["training"]
        result = {"training": {k: record.get(k) for k in ("heldout", "scorer", "seconds")}}
    result["seconds"] = round(time.perf_counter() - began, 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="builtin:wikitext-softmax")
    parser.add_argument("--data", required=True)
    parser.add_argument("--id-text", required=True)
    parser.add_argument("--ood-text", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--results", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=list(ARMS))
    parser.add_argument("--target-n", type=float, default=4.0)
    parser.add_argument("--transfer-steps", type=int, default=200)
    parser.add_argument("--distill-steps", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--eval-tokens", type=int, default=16384)
    parser.add_argument("--window", type=int, default=128)
    args = parser.parse_args()
    results_file = Path(args.results)
    results = json.loads(results_file.read_text()) if results_file.is_file() else {"runs": {}}
    results["settings"] = {k: v for k, v in vars(args).items() if k not in ("results",)}
    texts = {"id": Path(args.id_text).read_text(), "ood": Path(args.ood_text).read_text()}
    if "original" not in results:
        original = str(load_model(args.model).path)
        results["original"] = evaluate(original, texts, args)
    for seed in args.seeds:
        for arm in args.arms:
            key = f"{arm}-s{seed}"
            if key in results["runs"]:
                continue
            print(f"[{time.strftime('%H:%M:%S')}] {key}", flush=True)
            result = run_arm(arm, seed, args)
            result["ppl"] = evaluate(str(Path(args.out) / key), texts, args)
            results["runs"][key] = result
            results_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = results_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(results, indent=1))
            tmp.replace(results_file)
            print(f"  done in {result['seconds']} s: ppl {result['ppl']}", flush=True)


if __name__ == "__main__":
    main()
