"""The prepared GPU run of issue 22, item 6 (entry point: studies/gpu-study/run.sh, which calls this).

On one GPU, in about 8 minutes: (1) the ICL tasks `every` and `linear` at the paper's size (GPT-2,
12 layers × 8 heads × 256), softmax against SSA in the authors' GPT-2 setting (b = e, n = e^0.4,
one pair per layer, both learned: `ssa:b=2.718282,n=1.491825,share=layer`; the authors
parameterize b = e^a, n = e^ν, ssacli by softplus, so the start is theirs, the optimizer's path is
not), ≥ 3 paired seeds, through `ssacli.run_icl_sweep`; (2) a language-model pair (softmax against
`ssa:preset=authors`, 4 × 4 × 128 Llama) sized to the training text given: `--passes` over it,
through studies/lm/run.py. Writes OUT/icl/ and OUT/lm/ (each study's own results.json and
tables.md), and OUT/results.json (the design: steps, tokens, passes, the calibration; every run's
learned b and n per layer) with OUT/tables.md (both studies' tables).

ICL steps: unless --icl-steps is given, 20 timed steps of each arm at the paper's size pick the
number that fits --icl-budget seconds as if the runs were serial, sized by the slower arm (runs in
parallel on one GPU finish sooner; the measured seconds per step are recorded). Not yet run on a
GPU: the first run's learning curves (each run's ssacli.json) say whether `linear` was learned.

    studies/gpu-study/run.sh OUT --data ../shared/data/wikitext2/valid.txt \
        --id-text ../shared/data/wikitext2/test.txt --ood-text ../shared/data/tinyshakespeare.txt \
        --blimp ../shared/data/blimp
    studies/gpu-study/run.sh OUT --tiny --data train.txt --id-text id.txt --ood-text ood.txt   # CPU, < 1 min
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from ssacli.defaults import SCORER_LR

ROOT = Path(__file__).resolve().parents[2]
SSA_GPT2 = "ssa:b=2.718282,n=1.491825,share=layer"  # e and e^0.4, per layer, learned (learn=all)
ICL_ARMS = [{"label": "softmax", "spec": "softmax"}, {"label": "ssa-gpt2", "spec": SSA_GPT2}]
LM_ARMS = [{"label": "softmax", "spec": "softmax"}, {"label": "ssa-authors", "spec": "ssa:preset=authors"}]
BYTES_PER_TOKEN = 2.73  # WikiText-2 valid under the study's 1,024-token BPE (1,121,681 B, 411,471 tokens)
LM_MODEL = {"model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
            "hidden_size": 128, "intermediate_size": 256, "max_position_embeddings": 128,
            "tie_word_embeddings": True}  # fmt: skip
TINY_LM_MODEL = {**LM_MODEL, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
                 "hidden_size": 16, "intermediate_size": 32, "max_position_embeddings": 16}  # fmt: skip


def icl_plan(args: argparse.Namespace, steps: int) -> dict[str, Any]:
    return {
        "_comment": "studies/gpu-study/run.sh (issue 22, item 6): ICL, paper size, softmax vs SSA (GPT-2)",
        "tasks": ["every", "linear"], "archs": ["gpt2"],
        "scorers": [{**arm, "seeds": args.seeds} for arm in ICL_ARMS], "reference": "softmax",
        "steps": steps, "lr": args.icl_lr, "scorer_lr": SCORER_LR, "batch_size": 64,
        "preset": "cpu" if args.tiny else "paper",
        "points_start": 11, "points_end": 41, "outlier_position": 3, "prompts": 200,
        "sigmas": [1, 2, 4, 8, 16, 32], "lengths": [21, 41, 81, 161], "outliers": [10, 100, 1000],
        "coef_sigmas": [1, 2, 4, 8],
        # tiny: every view, fewer levels (the CPU check runs the same code paths, not the same grid)
        **({"sigmas": [1, 8], "lengths": [41, 81], "outliers": [100], "coef_sigmas": [1, 4], "prompts": 8}
           if args.tiny else {}),
    }  # fmt: skip


def lm_plan(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """The LM plan, steps sized to --passes over the training part (the first 90 %) of --data."""
    seq_len, batch = (16, 4) if args.tiny else (128, 16)
    estimated = int(0.9 * Path(args.data).stat().st_size / BYTES_PER_TOKEN)
    steps = 2 if args.tiny else max(2, round(args.passes * estimated / (seq_len * batch)))
    plan = {
        "_comment": "studies/gpu-study/run.sh (issue 22, item 6): an LM pair sized to the data",
        "data": args.data, "id_text": args.id_text, "ood_text": args.ood_text, "blimp": args.blimp,
        "model": TINY_LM_MODEL if args.tiny else LM_MODEL, "vocab_size": 300 if args.tiny else 1024,
        "seq_len": seq_len, "steps": steps, "lr": 1e-3, "batch_size": batch, "seeds": args.seeds,
        "arms": LM_ARMS, "reference": "softmax", "contexts": [1, 2, 4],
        "max_tokens": 256 if args.tiny else 16384, "blimp_limit": 3 if args.tiny else 200,
        # tiny: two fewer processes a run (tests/studies/test_lm_study.py covers it)
        "diagnose": not args.tiny,
        "diagnose_args": ["--samples", "4"],
    }  # fmt: skip
    sizing = {"estimated_train_tokens": estimated, "tokens_per_run": steps * seq_len * batch,
              "passes_asked": args.passes}  # fmt: skip
    return plan, sizing


def calibrate(args: argparse.Namespace) -> dict[str, Any]:
    """Seconds per training step of each ICL arm at the plan's size (20 steps after 5 of warm-up)."""
    import ssacli

    per_arm = {}
    for arm in ICL_ARMS:
        with tempfile.TemporaryDirectory() as scratch:
            timed = {}
            for steps in (5, 25):
                config = ssacli.ICLTrainConfig(task="linear", scorer=arm["spec"], steps=steps, lr=args.icl_lr,
                                               preset="paper", checkpoint_every=10_000)  # fmt: skip
                began = time.perf_counter()
                ssacli.train_icl(config, Path(scratch) / f"{arm['label']}-{steps}", device=args.device)
                timed[steps] = time.perf_counter() - began
            per_arm[arm["label"]] = (timed[25] - timed[5]) / 20
    return per_arm


def learned_scorers(folder: Path, kind: str) -> dict[str, dict[str, list[float]]]:
    """The learned scorer parameters (b, n, …) of every attention module of a finished run."""
    from ssacli.attention.interface import scorers_of

    if kind == "icl":
        from ssacli.models.icl import load_icl

        model = load_icl(folder)
    else:
        import ssacli

        model = ssacli.load_model(str(folder)).model
    return {
        name: {p: getattr(scorer, p).detach().float().flatten().tolist() for p in scorer.trainable}
        for name, scorer in scorers_of(model).items()
        if scorer.trainable
    }


def train_tokens(folder: Path, text: str) -> int:
    """Tokens of the training part (the first 90 %) of the text, under a run's own tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    return len(tokenizer(text[: int(0.9 * len(text))])["input_ids"])


def study_script(study: str, name: str) -> ModuleType:
    """studies/STUDY/NAME.py as a module, so its main() runs in this process (no second torch import)."""
    spec = importlib.util.spec_from_file_location(f"{study}_{name}", ROOT / "studies" / study / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--data", required=True, help="LM training text")
    parser.add_argument("--id-text", required=True, help="LM in-distribution evaluation text")
    parser.add_argument("--ood-text", required=True, help="LM out-of-distribution evaluation text")
    parser.add_argument("--blimp", help="folder of BLiMP .jsonl paradigms (optional)")
    parser.add_argument("--tiny", action="store_true", default=os.environ.get("GPU_STUDY_TINY") == "1",
                        help="a tiny end-to-end run on the CPU (also GPU_STUDY_TINY=1)")  # fmt: skip
    parser.add_argument("--device", help="default: cuda (cpu with --tiny)")
    parser.add_argument("--jobs", type=int, help="runs in parallel (default 4 on a GPU, 1 with --tiny)")
    parser.add_argument("--seeds", type=int, help="paired seeds (default 3; 2 with --tiny)")
    parser.add_argument("--icl-steps", type=int, help="fix the ICL steps (default: calibrated to the budget)")
    parser.add_argument("--icl-budget", type=float, default=270.0, help="ICL training s (serial-equivalent)")
    parser.add_argument("--icl-lr", type=float, default=3e-4)
    parser.add_argument("--passes", type=float, default=4.0, help="LM passes over the training text")
    args = parser.parse_args(argv)
    args.device = args.device or ("cpu" if args.tiny else "cuda")
    args.jobs = args.jobs or (1 if args.tiny else 4)  # tiny: workers would each import torch again
    args.seeds = args.seeds or (2 if args.tiny else 3)
    began = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    design: dict[str, Any] = {"tiny": args.tiny, "device": args.device, "jobs": args.jobs,
                              "seeds": args.seeds}  # fmt: skip

    calibration = None
    steps = args.icl_steps or (3 if args.tiny else None)
    if steps is None:
        calibration = calibrate(args)
        runs = 2 * len(ICL_ARMS) * args.seeds
        steps = int(min(20_000, max(50, args.icl_budget / (runs * max(calibration.values())))))
    design["icl"] = {"steps": steps, "seconds_per_step": calibration, "budget_s": args.icl_budget}
    plan = icl_plan(args, steps)
    (args.out / "icl-plan.json").write_text(json.dumps(plan, indent=1) + "\n")
    import ssacli

    icl_began = time.perf_counter()
    icl = ssacli.run_icl_sweep(ssacli.ICLSweepPlan.from_json(args.out / "icl-plan.json"), args.out / "icl",
                               jobs=args.jobs, device=args.device)  # fmt: skip
    design["icl"]["wall_s"] = round(time.perf_counter() - icl_began, 1)
    with open(args.out / "icl" / "tables.md", "w") as tables, contextlib.redirect_stdout(tables):
        study_script("icl", "tables").main([str(args.out / "icl" / "results.json")])

    lm, sizing = lm_plan(args)
    (args.out / "lm-plan.json").write_text(json.dumps(lm, indent=1) + "\n")
    lm_began = time.perf_counter()
    study_script("lm", "run").main(["--plan", str(args.out / "lm-plan.json"), "--out", str(args.out / "lm"),
                                    "--jobs", str(args.jobs), "--device", args.device,
                                    "--report", str(args.out / "lm")])  # fmt: skip
    lm_results = json.loads((args.out / "lm" / "results.json").read_text())
    first = args.out / "lm" / "runs" / f"{LM_ARMS[0]['label']}-s0"
    sizing["train_tokens"] = train_tokens(first, Path(args.data).read_text(encoding="utf-8"))
    sizing["passes"] = round(sizing["tokens_per_run"] / sizing["train_tokens"], 2)
    design["lm"] = {"steps": lm["steps"], **sizing, "wall_s": round(time.perf_counter() - lm_began, 1)}

    icl_runs = [
        {"task": r["task"], "arch": r["arch"], "label": r["label"], "spec": r["spec"], "seed": r["seed"],
         "final_loss": r["final_loss"], "train_seconds": r["train_seconds"],
         "error_in_distribution": in_distribution_error(r, plan["points_end"]),
         "scorer": learned_scorers(args.out / "icl" / "runs" / _icl_run_name(r), "icl")}
        for r in icl["runs"]
    ]  # fmt: skip
    lm_runs = [
        {**r, "scorer": learned_scorers(args.out / "lm" / "runs" / f"{r['label']}-s{r['seed']}", "lm")}
        for r in lm_results["runs"]
    ]
    design["wall_s"] = round(time.perf_counter() - began, 1)
    summary = {"design": design, "icl_plan": plan, "lm_plan": lm, "icl_runs": icl_runs, "lm_runs": lm_runs,
               "icl_paired": icl["paired"], "lm_paired": lm_results["paired"]}  # fmt: skip
    (args.out / "results.json").write_text(json.dumps(summary, indent=1) + "\n")
    (args.out / "tables.md").write_text(tables_page(summary, args.out))
    print(f"wrote {args.out / 'results.json'} and {args.out / 'tables.md'} in {design['wall_s']:.0f} s")
    return summary


def in_distribution_error(run: dict[str, Any], trained: int) -> float:
    """The run's headline error at σ = 1, the trained length, no outlier (MSE/Var(y) for linear)."""
    for c in run["cells"]:
        if (
            c["sigma"] == 1
            and c["outlier"] is None
            and c["length"] == trained
            and c.get("coef_sigma", 1) == 1
        ):
            return c["normalized_error"] if c["normalized_error"] is not None else c["error"]
    raise ValueError(f"run {run['label']}-s{run['seed']} has no in-distribution cell")


def _icl_run_name(run: dict[str, Any]) -> str:
    from ssacli.icl.sweep import run_name

    return run_name(run["task"], run["label"], run["seed"], run["arch"])


def tables_page(summary: dict[str, Any], out: Path) -> str:
    d = summary["design"]
    lm = d["lm"]
    icl, calibrated = summary["icl_plan"], d["icl"]["seconds_per_step"]
    head = [
        "# GPU study (studies/gpu-study/run.sh; issue 22)"
        + (" — TINY mode, not a result" if d["tiny"] else ""),
        "",
        f"Device {d['device']}, {d['jobs']} runs in parallel, {d['seeds']} paired seeds; "
        f"wall {d['wall_s']:.0f} s (ICL {d['icl']['wall_s']:.0f} s, LM {lm['wall_s']:.0f} s).",
        f"ICL: {icl['preset']} preset, {d['icl']['steps']} steps at lr {icl['lr']:g}"
        + (f" (calibrated: s/step {calibrated})" if calibrated else ""),
        f"LM: {lm['steps']} steps, {lm['tokens_per_run']:,} tokens a run over {lm['train_tokens']:,} "
        f"training tokens: {lm['passes']:g} passes.",
        "",
        "## In distribution and learned scorer parameters (ICL)",
        "",
        "| task | arm | seed | error / MSE÷Var at σ = 1 | final loss | learned (first layer … last) |",
        "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in summary["icl_runs"]:
        params = _param_text(r["scorer"])
        head.append(f"| {r['task']} | {r['label']} | {r['seed']} | {r['error_in_distribution']:.3f} | "
                    f"{r['final_loss']:.4f} | {params} |")  # fmt: skip
    head += ["", "## LM learned scorer parameters", "", "| arm | seed | learned (first layer … last) |",
             "|---|---|---|"]  # fmt: skip
    head += [f"| {r['label']} | {r['seed']} | {_param_text(r['scorer'])} |" for r in summary["lm_runs"]]
    icl_tables = (out / "icl" / "tables.md").read_text()
    lm_tables = (out / "lm" / "tables.md").read_text()
    return "\n".join([*head, "", "## ICL", icl_tables, "## LM", "", lm_tables])


def _param_text(scorers: dict[str, dict[str, list[float]]]) -> str:
    """b and n of each layer in order, e.g. "b 2.72 2.70 · n 1.49 1.52" (a per-head tensor: mean)."""
    if not scorers:
        return "–"
    names = sorted({p for values in scorers.values() for p in values})
    parts = []
    for p in names:
        means = [sum(v[p]) / len(v[p]) for v in scorers.values() if p in v]
        parts.append(f"{p} " + " ".join(f"{m:.3g}" for m in means))
    return " · ".join(parts)


if __name__ == "__main__":
    main()
