"""Bundle finished runs of the language-model study as builtin models (builtin:wikitext-softmax, …).

    python scripts/bundle_lm.py --plan docs/results/lm-plan.json --study runs/lm-study \
        wikitext-softmax=softmax-s0 wikitext-ssa=ssa-authors-s0

For each NAME=RUN (a folder STUDY/runs/RUN written by `ssacli train` through studies/lm/run.py):

1. refuse a run that has not reached the plan's steps, or whose record disagrees with the plan;
2. copy what inference needs (config, tokenizer, ssacli.json, the scorer's parameters; no optimizer
   state) and the weights stored in float16, so a folder stays under 2 MB (the study's model has
   0.79M parameters: 3.1 MB in float32). The scorer's parameters (a few numbers) stay float32, byte
   for byte. ssacli loads the float16 weights as float32 on CPU (``--dtype auto``);
3. measure the float16 bundle against the float32 run on the plan's in-distribution text (logits,
   attention weights, mean NLL) and refuse it outside :data:`TOLERANCES`;
4. write RECIPE.md from the run's own record, with those numbers and the sizes.

A bundle is built in a temporary folder and moved into place only when every check passes.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import ssacli
from ssacli.defaults import TAU
from ssacli.files import replace_folder
from ssacli.models.checkpoint import META_FILE, ORIGINAL_TYPE_KEY, SCORER_FILE, WEIGHTS_FILE
from ssacli.models.loading import BUILTIN_DIR
from ssacli.quality.lm_study import finished_steps, load_plan
from ssacli.quality.measures import language_model_loss

ROOT = Path(__file__).resolve().parent.parent
COPIED = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", META_FILE, SCORER_FILE)
BUDGET_BYTES = 2_000_000  # per bundled folder (issue 16: "<= 2 MB each")
# float16 keeps 11 significant bits, so rounding moves each weight by at most 2**-11 ≈ 4.9e-4 of
# itself. The tolerances leave room for that error to grow through the model's blocks, and stay
# below what the bundle is used for:
TOLERANCES = {
    # nats per token: the bundle's perplexity within 0.5 % of the run's
    "nll_abs_diff": 5e-3,
    # rms(Δ logit) / rms(logit): 20 × the weights' own rounding
    "logit_rms_rel": 1e-2,
    # largest change of any attention weight: diagnose counts a row as collapsed at max weight >= TAU
    # (0.9), so only rows whose largest weight lies within this of TAU could change their count
    "attention_max_abs": 1e-2,
}
FIDELITY_WINDOWS = 16  # windows of the plan's seq_len compared logit by logit (and attention weight)


# ---- checks ------------------------------------------------------------------------------------------


def check_run(plan: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The run's ssacli.json, once it is finished and trained as the plan says (else SystemExit)."""
    if not folder.is_dir():
        raise SystemExit(f"{folder}: no such run")
    step = finished_steps(folder)
    if step != plan["steps"]:
        raise SystemExit(f"{folder}: at step {step}, not finished (the plan trains {plan['steps']} steps)")
    meta = json.loads((folder / META_FILE).read_text())
    config = meta["training"]["config"]
    expected = {k: plan[k] for k in ("steps", "lr", "batch_size", "seq_len", "data")}
    found = {k: config[k] for k in expected}
    found_vocab = meta["scratch"]["vocab_size"]
    if found != expected or found_vocab != plan["vocab_size"]:
        raise SystemExit(f"{folder}: trained with {found}, vocab {found_vocab}, not the plan's {expected}")
    model_config = json.loads((folder / "config.json").read_text())
    if ORIGINAL_TYPE_KEY in model_config:  # an SSA run's config.json is guarded against plain transformers
        model_config["model_type"] = model_config[ORIGINAL_TYPE_KEY]
    differs = {k: model_config.get(k) for k, v in plan["model"].items() if model_config.get(k) != v}
    if differs:
        raise SystemExit(f"{folder}: its config.json differs from the plan's model: {differs}")
    return meta


def check_fidelity(values: dict[str, float]) -> list[str]:
    """The tolerances a measurement misses (empty: it passes); a NaN misses every one."""
    return [
        f"{key} = {values[key]:.3g} > {limit:g}"
        for key, limit in TOLERANCES.items()
        if not values[key] <= limit
    ]


# ---- writing -----------------------------------------------------------------------------------------


def write_float16(source: Path, target: Path) -> None:
    """Copy the run's inference files into ``target``, its weights rounded to float16."""
    with safe_open(source / WEIGHTS_FILE, "pt") as handle:
        metadata = handle.metadata()
    weights = load_file(source / WEIGHTS_FILE)
    half = {k: v.to(torch.float16).contiguous() for k, v in weights.items()}
    overflow = [k for k, v in half.items() if not torch.isfinite(v).all()]
    if overflow:
        raise SystemExit(f"{source}: {overflow[0]} does not fit in float16; bundle it in float32")
    save_file(half, target / WEIGHTS_FILE, metadata=metadata)
    config = json.loads((source / "config.json").read_text())
    config["dtype"] = "float16"  # what the stored tensors are: --dtype auto keeps it on a GPU
    (target / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for name in COPIED:
        if (source / name).is_file():
            shutil.copy2(source / name, target / name)


def fidelity(run: Path, bundle: Path, text: str, seq_len: int, max_tokens: int) -> dict[str, Any]:
    """The float16 bundle (loaded as float32, as diagnose loads it on CPU) against the float32 run."""
    full = ssacli.load_model(str(run), device="cpu", dtype="float32")
    small = ssacli.load_model(str(bundle), device="cpu", dtype="float32")
    weights_dtype = {p.dtype for p in small.model.parameters()}
    ids = full.tokenizer(text[: 40 * seq_len * FIDELITY_WINDOWS], verbose=False)["input_ids"]
    ids = torch.tensor(ids[: seq_len * FIDELITY_WINDOWS]).reshape(FIDELITY_WINDOWS, seq_len)
    with torch.no_grad():
        a = full.model(input_ids=ids, output_attentions=True)
        b = small.model(input_ids=ids, output_attentions=True)
    dlogit = (a.logits.double() - b.logits.double()).flatten()
    attention = max(float((x - y).abs().max()) for x, y in zip(a.attentions, b.attentions, strict=True))
    agree = float((a.logits.argmax(-1) == b.logits.argmax(-1)).double().mean())
    loss_run = language_model_loss(full, text, seq_len=seq_len, max_tokens=max_tokens)
    loss_bundle = language_model_loss(small, text, seq_len=seq_len, max_tokens=max_tokens)
    scorers = {
        name: (ssacli.scorers_of(full.model)[name].state_dict(), s.state_dict())
        for name, s in ssacli.scorers_of(small.model).items()
    }
    return {
        "loaded_dtype": ", ".join(sorted(str(d).removeprefix("torch.") for d in weights_dtype)),
        "windows": f"{FIDELITY_WINDOWS} × {seq_len} tokens",
        "logit_rms_rel": float(dlogit.pow(2).mean().sqrt() / a.logits.double().pow(2).mean().sqrt()),
        "logit_max_abs": float(dlogit.abs().max()),
        "top1_agreement": agree,
        "attention_max_abs": attention,
        "nll_run": loss_run["nll"],
        "nll_bundle": loss_bundle["nll"],
        "nll_abs_diff": abs(loss_run["nll"] - loss_bundle["nll"]),
        "perplexity_run": loss_run["perplexity"],
        "perplexity_bundle": loss_bundle["perplexity"],
        "nll_tokens": loss_run["tokens"],
        "scorer_params_equal": (
            all(set(x) == set(y) and all(torch.equal(x[k], y[k]) for k in x) for x, y in scorers.values())
            if any(y for _, y in scorers.values())
            else None  # a scorer without parameters (softmax)
        ),
        "scorer_values": scorer_values(small.model),
    }


def scorer_values(model: torch.nn.Module) -> dict[str, list[float]]:
    """Each scorer parameter as the model uses it (SSA: b and n), per layer, the first head's
    value, keyed "learned n", "fixed b", …"""
    values: dict[str, list[float]] = {}
    for scorer in ssacli.scorers_of(model).values():
        for name in getattr(scorer, "trainable", ()):
            tensor = getattr(scorer, name, None)
            if isinstance(tensor, torch.Tensor):
                key = f"{'learned' if name in scorer.learn else 'fixed'} {name}"
                values.setdefault(key, []).append(round(float(tensor.detach().flatten()[0]), 4))
    return values


def git_commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


# ---- RECIPE.md ---------------------------------------------------------------------------------------


def interruptions(training: dict[str, Any]) -> list[int]:
    """Steps at which the run was stopped and later resumed: checkpoints off the regular grid."""
    every, steps = training["config"]["checkpoint_every"], training["steps"]
    return [t["step"] for t in training["trajectory"] if t["step"] not in (0, steps) and t["step"] % every]


def recipe(name: str, run: str, meta: dict[str, Any], plan_path: Path, check: dict, sizes: dict) -> str:
    training, scratch = meta["training"], meta["scratch"]
    config = training["config"]
    stops = interruptions(training)
    resumed = [f"interrupted at step {', '.join(map(str, stops))} and resumed (`--resume`)"] if stops else []
    last = training["trajectory"][-1]
    first_heldout = training["heldout"][0][1]
    arch = (check["architecture"], check["parameters"])
    scorer_lines = [
        f"{key} per layer: {', '.join(f'{v:g}' for v in values)}"
        for key, values in check["scorer_values"].items()
    ]
    warmup = config["warmup"] if config["warmup"] is not None else "default (5 % of steps, <= 100)"
    facts = "\n".join(
        "- " + line
        for line in (
            f"model: {arch[0]}; {arch[1]:,} parameters",
            f"tokenizer: byte-level BPE, {scratch['tokenizer_vocab']} tokens, trained by `ssacli train` on "
            "the training part of the data",
            f"scorer: `{meta['scorer']}`",
            *scorer_lines,
            f"data: `{config['data']}` (its last 10 % held out), {config['seq_len']}-token windows",
            f"seed {config['seed']}, {training['step']} steps, AdamW lr {config['lr']:g} "
            f"({config['schedule']}), warmup {warmup}, weight decay {config['weight_decay']:g}",
            f"batch {config['batch_size']} × {config['grad_accum']} accumulation: "
            f"{training['tokens']:,} tokens in all",
            f"training time: {training['seconds']} s, {training['tokens_per_s']:,.0f} tokens/s (on the "
            "study's CPU, shared with other jobs)",
            *resumed,
            *check["notes"],
            f"final training loss {last['loss']:.4f}; held-out loss {first_heldout:.4f} at step 0 → "
            f"{last['heldout_loss']:.4f} at step {last['step']}",
            f"bundled with ssacli {ssacli.__version__} at commit `{check['commit']}` by "
            "`scripts/bundle_lm.py`; `ssacli.json` is the run's own record, unchanged",
        )
    )
    size_rows = "".join(f"| {file} | {size:,} |\n" for file, size in sizes.items())
    tol = TOLERANCES
    scorer_equal = (
        "– (it has none)" if check["scorer_params_equal"] is None else str(check["scorer_params_equal"])
    )
    limit = {k: f"≤ {v:g}" for k, v in tol.items()}
    fidelity_rows = "\n".join(
        f"| {what} | {value} | {bound} |"
        for what, value, bound in (
            ("rms Δlogit / rms logit", f"{check['logit_rms_rel']:.2e}", limit["logit_rms_rel"]),
            ("max \\|Δlogit\\|", f"{check['logit_max_abs']:.2e}", "–"),
            ("top-1 agreement", f"{check['top1_agreement']:.4f}", "–"),
            ("max \\|Δ attention weight\\|", f"{check['attention_max_abs']:.2e}", limit["attention_max_abs"]),
            ("mean NLL, run → bundle", f"{check['nll_run']:.5f} → {check['nll_bundle']:.5f}",
             f"\\|Δ\\| {limit['nll_abs_diff']}"),
            ("perplexity, run → bundle",
             f"{check['perplexity_run']:.3f} → {check['perplexity_bundle']:.3f}", "–"),
            ("scorer parameters equal to the run's", scorer_equal, "must be"),
        )
    )  # fmt: skip
    command = (
        f"ssacli train --data {config['data']} --size model-config.json --scorer '{meta['scorer']}' \\\n"
        f"  --steps {config['steps']} --lr {config['lr']:g} --batch-size {config['batch_size']} "
        f"--seq-len {config['seq_len']} \\\n  --vocab-size {scratch['vocab_size']} --seed {config['seed']} "
        f"--checkpoint-every {config['checkpoint_every']}"
        + (f" --attention {config['attention']}" if config.get("attention", "auto") != "auto" else "")
        + f" --out {run}"
    )
    return f"""# builtin:{name}

Trained by the language-model study (issue 16; docs/results/lm.md, plan `{plan_path}`), run
`{run}`: a decoder trained from scratch with `ssacli train`.

{facts}

## Stored in float16

The weights are stored in float16 (round to nearest) to stay under 2 MB; the scorer's parameters,
if it has any, are the run's float32 file, byte for byte. With `--dtype auto`, ssacli loads the weights as
float32 on a CPU (exact: every float16 is a float32) and keeps float16 on a GPU.

| file | bytes |
|---|---|
{size_rows}| total | {sum(sizes.values()):,} |

Measured against the float32 run, both loaded as float32 on CPU, on the first
{check["windows"]} of `{check["text"]}` (logits and every attention weight) and on its first
{check["nll_tokens"]:,} scored tokens in {config["seq_len"]}-token windows (NLL, as the study measures it):

| measure | value | tolerance |
|---|---|---|
{fidelity_rows}

Why these tolerances: float16 keeps 11 significant bits, so each weight moves by at most
2⁻¹¹ ≈ 4.9e-4 of itself; {tol["logit_rms_rel"]:g} relative on the logits leaves room for that error to
grow through the {check["layers"]} blocks. {tol["nll_abs_diff"]:g} nats keeps the perplexity within
{100 * math.expm1(tol["nll_abs_diff"]):.1f} %. An attention weight that moves by less than
{tol["attention_max_abs"]:g} can change diagnose's collapse count (max weight ≥ τ = {TAU:g}) only for
rows whose largest weight lies within {tol["attention_max_abs"]:g} of τ.

## Reproduce

```bash
python studies/lm/run.py --plan {plan_path} --out runs/lm-study   # trains (and evaluates) every run
python scripts/bundle_lm.py --plan {plan_path} --study runs/lm-study {name}={run}
```

or this run alone, with the plan's `model` as `model-config.json`:

```bash
{command}
```
"""


# ---- main --------------------------------------------------------------------------------------------


def bundle(
    plan, plan_path: Path, study: Path, name: str, run: str, package: Path, text_path: Path, notes: list[str]
) -> dict:
    source = study / "runs" / run
    meta = check_run(plan, source)
    package.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=package))
    try:
        write_float16(source, tmp)
        text = text_path.read_text(encoding="utf-8")
        check = fidelity(source, tmp, text, plan["seq_len"], plan["max_tokens"])
        missed = check_fidelity(check)
        if check["scorer_params_equal"] is False:
            missed.append("the scorer's parameters differ from the run's")
        if missed:
            raise SystemExit(f"builtin:{name} from {source}: outside the tolerances: {'; '.join(missed)}")
        config = json.loads((source / "config.json").read_text())
        weights = load_file(source / WEIGHTS_FILE)
        check.update(
            text=str(text_path), commit=git_commit(), notes=notes, layers=config["num_hidden_layers"],
            parameters=sum(v.numel() for v in weights.values()),
            architecture=(
                f"{config['model_type']}, {config['num_hidden_layers']} layers × "
                f"{config['num_attention_heads']} heads, width {config['hidden_size']}, MLP "
                f"{config['intermediate_size']}, vocabulary {config['vocab_size']}, "
                f"{config['max_position_embeddings']} positions"
                + (", tied embeddings" if config.get("tie_word_embeddings") else "")
            ),
        )  # fmt: skip
        sizes = {f.name: f.stat().st_size for f in sorted(tmp.iterdir()) if f.is_file()}
        sizes["RECIPE.md"] = 0
        while True:  # the table lists RECIPE.md's own size: write until it stops changing
            (tmp / "RECIPE.md").write_text(recipe(name, run, meta, plan_path, check, sizes))
            written = (tmp / "RECIPE.md").stat().st_size
            if written == sizes["RECIPE.md"]:
                break
            sizes["RECIPE.md"] = written
        total = sum(sizes.values())
        if total > BUDGET_BYTES:
            raise SystemExit(f"builtin:{name}: {total:,} bytes, over the {BUDGET_BYTES:,}-byte budget")
        replace_folder(tmp, package / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"name": name, "run": str(source), "bytes": total, "sizes": sizes, **check}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", type=Path, required=True)
    parser.add_argument("--study", type=Path, required=True, help="the study's --out folder")
    parser.add_argument("--package", type=Path, default=BUILTIN_DIR, help="where builtin models live")
    parser.add_argument("--text", type=Path, help="fidelity text (default: the plan's id_text)")
    parser.add_argument(
        "--note", action="append", default=[], metavar="NAME=TEXT", help="a line for NAME's RECIPE.md"
    )
    parser.add_argument("pairs", nargs="+", metavar="NAME=RUN")
    args = parser.parse_args(argv)
    plan = load_plan(args.plan)
    pairs = [p.split("=", 1) for p in args.pairs]
    if any(len(p) != 2 or not all(p) for p in pairs):
        parser.error("give NAME=RUN pairs, e.g. wikitext-softmax=softmax-s0")
    text = args.text or Path(plan["id_text"])
    for name, run in pairs:
        notes = [n.split("=", 1)[1] for n in args.note if n.split("=", 1)[0] == name]
        done = bundle(plan, args.plan, args.study, name, run, args.package, text, notes)
        keys = ("logit_rms_rel", "logit_max_abs", "top1_agreement", "attention_max_abs", "nll_abs_diff")
        numbers = ", ".join(f"{k} {done[k]:.3g}" for k in keys)
        print(f"bundled {run} as builtin:{name}: {done['bytes']:,} bytes; {numbers}; "
              f"perplexity {done['perplexity_run']:.3f} → {done['perplexity_bundle']:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
