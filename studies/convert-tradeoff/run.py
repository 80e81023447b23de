"""The conversion trade-off study (docs/results/convert-tradeoff.md): per n, quality and robustness
against the softmax control with the same budget, 8 paired seeds.

    python studies/convert-tradeoff/run.py --data ../shared/data/wikitext2/test.txt \
        --ood-text ../shared/data/tinyshakespeare.txt --out runs/convert-tradeoff \
        --record docs/results/convert-tradeoff --seeds 0 1 2 3 4 5 6 7 --jobs 2

Runs on :func:`ssacli.study.execute`: one folder per (arm, seed) under OUT/runs, its eval.json the
mark of a finished run (not run again), an unfinished one resumed from its checkpoint. Each result is
also copied to RECORD/runs/ARM-sSEED.json as it finishes (commit them as they come); RECORD/results.json
holds every result so far with the paired summaries against the control.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

from ssacli.files import write_json
from ssacli.study import StudyRun, by_seed, execute, summarize

ARMS: dict[str, dict[str, Any]] = {
    # name: the recipe's settings (None: no training); "control" is the softmax control
    "original": None,
    "control": {"control": True},
    "faithful": {"target_n": None, "stages": ("distill",)},
    "n8": {"target_n": 8.0},
    "n4": {"target_n": 4.0},
    "n2": {"target_n": 2.0},
    "n4-no-transfer": {"target_n": 4.0, "stages": ("distill",)},
    "n4-learned": {"target_n": 4.0, "learn_n": True},
    # the objective (KL to the original + lm_weight x LM loss; 1 above): KL alone, LM-heavy
    "n4-kl": {"target_n": 4.0, "lm_weight": 0.0},
    "n4-lm4": {"target_n": 4.0, "lm_weight": 4.0},
    "control-lm4": {"control": True, "lm_weight": 4.0},
}
REFERENCE = "control"
METRICS = ("heldout_ppl", "ood_ppl", "ppl_2x", "ppl_4x", "output_kl_key8", "collapse_key8", "pairs_accuracy")


def perplexity(loaded, ids, window: int) -> float | None:
    import torch
    from torch.nn import functional as F

    count = len(ids) // window
    if count == 0:
        return None
    rows = ids[: count * window].view(count, window).long()
    nll = []
    with torch.no_grad():
        for batch in rows.split(8):
            logits = loaded.model(input_ids=batch, use_cache=False).logits.double()
            nll.append(
                F.cross_entropy(logits[:, :-1].flatten(0, 1), batch[:, 1:].flatten(), reduction="none")
            )
    return math.exp(float(torch.cat(nll).mean()))


def evaluate(model: str, job: dict[str, Any]) -> dict[str, Any]:
    """The endpoints of one trained model (or the original), on the same tokens for every arm."""
    import ssacli
    from ssacli.models.loading import load_model
    from ssacli.train.data import TextData

    loaded = load_model(model, dtype="float32", device="cpu")
    loaded.model.eval()
    data = TextData.load(job["data"], loaded.tokenizer)
    held = data.heldout_stream[: job["tokens"]]
    ood = TextData.load(job["ood"], loaded.tokenizer).train_stream[: job["tokens"]]
    seq = job["seq_len"]
    result = {
        "heldout_ppl": perplexity(loaded, held, seq),
        "heldout_tokens": len(held) // seq * seq,
        "ood_ppl": perplexity(loaded, ood, seq),
        "ppl_2x": perplexity(loaded, held, 2 * seq),
        "ppl_4x": perplexity(loaded, held, 4 * seq),
    }
    diagnosis = ssacli.diagnose(
        loaded, ["key-scale:1,8"], text=data.heldout_text, samples=8, length=seq, seed=0
    ).to_dict()
    probe = diagnosis["probes"][0]
    result["output_kl_key8"] = probe["extras"]["output_kl"][-1]
    result["collapse_key8"] = probe["summary"]["model"]["collapse_rate"][-1]
    result.update(general_measure(loaded, job))
    return result


def general_measure(loaded, job: dict[str, Any]) -> dict[str, Any]:
    """Minimal-pair accuracy (BLiMP paradigms): a measure of the model's grammar beyond either text."""
    if not job.get("pairs"):
        return {}
    from ssacli.quality.measures import minimal_pairs

    pairs = minimal_pairs(loaded, job["pairs"], limit=job["pairs_limit"])
    return {"pairs_accuracy": pairs["accuracy"], "pairs": pairs["pairs"]}


def fill_general_measure(out: Path, record: Path, results: list[dict[str, Any]], job: dict[str, Any]) -> None:
    """Runs finished before the general measure existed get it from their saved model (the original
    from its source), written back to eval.json and the record."""
    import json

    from ssacli.models.loading import load_model

    for result in results:
        if not job.get("pairs") or "pairs_accuracy" in result:
            continue
        name = f"{result['arm']}-s{result['seed']}"
        model = job["model"] if ARMS[result["arm"]] is None else str(out / "runs" / name / "model")
        loaded = load_model(model, dtype="float32", device="cpu")
        loaded.model.eval()
        added = general_measure(loaded, job)
        result.update(added)
        saved = out / "runs" / name / "eval.json"
        write_json({**json.loads(saved.read_text()), **added}, saved)
        write_json(result, record / "runs" / f"{name}.json")
        print(f"{name}: pairs_accuracy {added['pairs_accuracy']:.4g} (filled)", flush=True)


def work(run: StudyRun, folder: Path) -> dict[str, Any]:
    from ssacli.train.recipe import RecipeConfig, convert_with_recipe, softmax_control

    job = run.job
    began = time.perf_counter()
    settings = ARMS[run.label]
    result: dict[str, Any] = {"arm": run.label, "seed": run.seed}
    if settings is None:
        result.update(evaluate(job["model"], job))
    else:
        settings = dict(settings)
        control = settings.pop("control", False)
        config = RecipeConfig(
            data=job["data"], transfer_steps=job["transfer_steps"], distill_steps=job["distill_steps"],
            batch_size=job["batch_size"], seq_len=job["seq_len"], seed=run.seed, eval_every=job["eval_every"],
            checkpoint_every=job["checkpoint_every"], **settings,
        )  # fmt: skip
        arm = softmax_control if control else convert_with_recipe
        _, record = arm(job["model"], folder / "model", config, resume=True, device="cpu")
        result["recipe_final"] = record["final"]
        result["heldout"] = record["heldout"]
        result["recipe_seconds"] = record["seconds"]
        result.update(evaluate(str(folder / "model"), job))
    result["seconds"] = round(time.perf_counter() - began, 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="builtin:wikitext-softmax")
    parser.add_argument("--data", required=True, help="fine-tuning text; its last tenth is held out")
    parser.add_argument("--ood-text", required=True)
    parser.add_argument("--out", required=True, help="the runs' folders (models, checkpoints)")
    parser.add_argument("--record", required=True, help="where results go (committed)")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(8)))
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--transfer-steps", type=int, default=100)
    parser.add_argument("--distill-steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=16384, help="evaluation tokens per text")
    parser.add_argument("--pairs", help="minimal pairs (a folder of BLiMP .jsonl): the general measure")
    parser.add_argument("--pairs-limit", type=int, default=100, help="pairs per file")
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args()
    job = {
        "model": args.model, "data": str(Path(args.data).resolve()),
        "ood": str(Path(args.ood_text).resolve()),
        "transfer_steps": args.transfer_steps, "distill_steps": args.distill_steps,
        "batch_size": args.batch_size, "seq_len": args.seq_len, "eval_every": args.eval_every,
        "checkpoint_every": args.checkpoint_every, "tokens": args.tokens,
        "pairs": args.pairs and str(Path(args.pairs).resolve()), "pairs_limit": args.pairs_limit,
    }  # fmt: skip
    # seeds outermost: every arm of seed 0 finishes before seed 1 starts, so a stopped study is paired
    runs = [StudyRun(f"{arm}-s{seed}", arm, seed, job) for seed in args.seeds for arm in args.arms]
    record = Path(args.record)

    def on_result(run: StudyRun, result: dict[str, Any]) -> None:
        write_json(result, record / "runs" / f"{run.name}.json")
        print(f"{run.name}: " + ", ".join(f"{k} {result.get(k):.4g}" for k in METRICS
                                         if result.get(k) is not None), flush=True)  # fmt: skip

    results = execute(runs, args.out, work, jobs=args.jobs, on_result=on_result)
    fill_general_measure(Path(args.out), record, results, job)
    write_summary(record, {"job": job, "arms": args.arms, "seeds": args.seeds}, results)


def write_summary(record: Path, plan: dict[str, Any], results: list[dict[str, Any]]) -> None:
    """RECORD/results.json: every run and, per metric, each arm against the control seed by seed."""
    values = [
        (metric, r["arm"], r["seed"], r[metric])
        for r in results
        for metric in METRICS
        if r.get(metric) is not None
    ]
    aggregate, paired = summarize(by_seed(values), REFERENCE, fields=lambda metric: {"metric": metric})
    write_json(
        {"plan": plan, "runs": results, "aggregate": aggregate, "paired": paired}, record / "results.json"
    )


if __name__ == "__main__":
    main()
