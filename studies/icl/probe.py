"""The planted-outlier probe of docs/results/icl.md on bundled (or any) ICL checkpoints.

    python studies/icl/probe.py builtin:every-softmax builtin:every-ssa

For each outlier value planted at x_3 (σ = 1, 41 points, 1000 prompts): prompt accuracy (no wrong
sign from position 3 on), position accuracy, and the attention mass that later tokens put on the
outlier (largest layer, mean over heads), next to the same mass on ordinary prompts.
"""

from __future__ import annotations

import sys

from ssacli.icl.evaluate import evaluate, outlier_capture
from ssacli.models.icl import load_icl
from ssacli.models.loading import resolve_model_path

VALUES = (10.0, 100.0, 1000.0, -10.0, -100.0, -1000.0)


def main(refs: list[str]) -> None:
    print("| model | outlier at x_3 | prompt acc. | position acc. | attention on x_3 (plain → planted) |")
    print("|---|---|---|---|---|")
    for ref in refs:
        model = load_icl(resolve_model_path(ref))
        points = model.spec.training["config"]["points_end"]
        base = max(r["mean_over_heads"] for r in outlier_capture(model, None, points=points))
        cells = evaluate(model, lengths=(points,), outliers=tuple((v, 3) for v in VALUES), prompts=1000)
        for cell in cells:
            captured = max(r["mean_over_heads"] for r in outlier_capture(model, cell.outlier, points=points))
            print(
                f"| {ref} | {cell.outlier:g} | {100 * (1 - cell.error):.1f}% | "
                f"{100 * (1 - cell.position_error):.2f}% | {base:.3f} → {captured:.3f} |"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
