"""Copy trained runs of the ICL study into the package as bundled checkpoints (builtin:NAME).

    python scripts/bundle_checkpoints.py runs/icl-study every-softmax=every-softmax-s0 \
        every-ssa=every-ssa-learned-s0 linear-softmax=linear-softmax-s0 linear-ssa=linear-ssa-learned-s0

Only inference files are copied (config.json, model.safetensors, ssacli.json; no optimizer state),
and a RECIPE.md records the command, seed and steps that produced each one.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from ssacli.icl.train import TrainConfig
from ssacli.models.checkpoint import META_FILE, WEIGHTS_FILE, read_icl_meta

PACKAGE = Path(__file__).resolve().parent.parent / "ssacli" / "checkpoints"
FILES = ("config.json", WEIGHTS_FILE, META_FILE)
BUDGET_BYTES = 2 * 1024 * 1024


def recipe(name: str, run: str, sweep: Path) -> str:
    meta = read_icl_meta(sweep / "runs" / run)
    cfg = meta["training"]["config"]
    evaluation = json.loads((sweep / "runs" / run / "eval.json").read_text())
    trained = [
        c
        for c in evaluation["cells"]
        if c["sigma"] == 1 and c["length"] == cfg["points_end"] and c["outlier"] is None
    ][0]
    every = TrainConfig(**cfg).curriculum_every()
    metric = "prompts with an error" if cfg["task"] != "linear" else "MSE"
    command = (
        f"ssacli icl train --task {cfg['task']} --scorer '{cfg['scorer']}' --steps {cfg['steps']} "
        f"--lr {cfg['lr']:g} --batch-size {cfg['batch_size']} --seed {cfg['seed']} --preset {cfg['preset']} "
        f"--points-start {cfg['points_start']} --points-end {cfg['points_end']} --out {name}"
    )
    return f"""# builtin:{name}

Trained by the ICL study (docs/results/icl.md, plan docs/results/icl-plan.json), run `{run}`.

- task: `{cfg["task"]}`, scorer: `{cfg["scorer"]}`
- model: GPT-2 backbone, {meta["layers"]} layers, {meta["heads"]} heads, width {meta["width"]}
- seed {cfg["seed"]}, {cfg["steps"]} steps, Adam lr {cfg["lr"]:g}, batch {cfg["batch_size"]},
  curriculum {cfg["points_start"]} → {cfg["points_end"]} points (+2 every {every} steps)
- training time: {meta["training"]["seconds"]} s on one CPU thread
- in distribution (σ = 1, {cfg["points_end"]} points, {trained["prompts"]} prompts): {metric} =
  {trained["error"]:.4f}

Reproduce it alone:

```bash
{command}
```
"""


def main(argv: list[str]) -> None:
    sweep, pairs = Path(argv[0]), [a.split("=", 1) for a in argv[1:]]
    PACKAGE.mkdir(exist_ok=True)
    for name, run in pairs:
        source, target = sweep / "runs" / run, PACKAGE / name
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        for file in FILES:
            shutil.copy2(source / file, target / file)
        (target / "RECIPE.md").write_text(recipe(name, run, sweep))
        print(f"bundled {run} as builtin:{name}")
    total = sum(f.stat().st_size for f in PACKAGE.rglob("*") if f.is_file())
    print(f"bundled checkpoints: {total / 1024:.0f} KiB in all")
    if total > BUDGET_BYTES:
        sys.exit(f"over the {BUDGET_BYTES // 1024} KiB budget")


if __name__ == "__main__":
    main(sys.argv[1:])
