"""What `ssacli check --init`'s default gates catch on one model: harmless changes (another prompt
seed, bfloat16, the native build forced to AVX2 and to no AVX, the model's own SSA conversion (the
faithful start by default: softmax within 1e-3 nats/token at baseline, polynomial past |logit| ≈ m), other
models named with --also) and graded damage (ssacli.testing.damage), each checked against the gates
`check --init` writes for MODEL. Prints a markdown table (docs/ci.md, "What the default gates catch").

    python scripts/gate_table.py builtin:wikitext-softmax --also builtin:wikitext-ssa
    python scripts/gate_table.py runs/smollm2-135m-instruct --config smollm2.toml  # reuse measured gates

The forced-build rows run `ssacli check` in a fresh process with a private native-kernel cache
($SSACLI_NATIVE_CFLAGS, $MKL_ENABLE_INSTRUCTIONS, $ATEN_CPU_CAPABILITY, as
tests/kernels/test_native_portable.py). A cell is the measured value, ✓ (passes) or ✗ (fails).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ssacli  # noqa: E402
from ssacli.check.config import load_config  # noqa: E402
from ssacli.testing.damage import DAMAGE  # noqa: E402

BUILDS = {"native build forced to AVX2": ("-mno-avx512f", "AVX2", "avx2"),
          "native build forced to no AVX": ("-mno-avx", "SSE4_2", "default")}  # fmt: skip


def _row(report) -> dict[str, tuple[float, bool]]:
    return {r.text: (o.measured, o.passed) for r, o in zip(report.requirements, report.outcomes)}


def _forced_build(model: str, config: Path, flags: tuple[str, str, str]) -> dict[str, tuple[float, bool]]:
    cflags, mkl, aten = flags
    with tempfile.TemporaryDirectory() as cache:
        out = Path(cache) / "check.json"
        env = {**os.environ, "SSACLI_NATIVE_CFLAGS": cflags, "SSACLI_CACHE": cache,
               "MKL_ENABLE_INSTRUCTIONS": mkl, "ATEN_CPU_CAPABILITY": aten}  # fmt: skip
        env.pop("SSACLI_BACKEND", None)
        cmd = [
            sys.executable,
            "-m",
            "ssacli",
            "check",
            model,
            "--config",
            str(config),
            "--json",
            str(out),
            "-q",
        ]
        subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
        done = json.loads(out.read_text())
    return {r["expr"]: (r["measured"], r["passed"]) for r in done["requirements"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--config", type=Path, help="gates already written by check --init (else written)")
    parser.add_argument("--also", action="append", default=[], help="another model, checked as a row")
    parser.add_argument("--no-builds", action="store_true", help="skip the forced-build rows")
    parser.add_argument(
        "--convert",
        default="ssa:init=faithful",
        help="the SSA conversion row's spec (default: the faithful start)",
    )
    args = parser.parse_args()
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="gate-table-"))
    config = args.config or work / "ssacli.toml"
    if not config.exists():
        ssacli.write_check_config(args.model, config)
        print(
            f"# gates written by check --init in {time.perf_counter() - started:.0f} s: {config}", flush=True
        )
    requires = load_config(config)["requires"]
    base = ssacli.load_model(args.model)
    rows: list[tuple[str, str, dict]] = []

    def check(kind: str, name: str, model, **options) -> None:
        t0 = time.perf_counter()
        rows.append((kind, name, _row(ssacli.run_check(model, requires, **options))))
        print(f"# {name}: {time.perf_counter() - t0:.0f} s", flush=True)

    check("reference", "the model as measured (seed 0)", base)
    check("harmless", "another prompt seed (7)", base, seed=7)
    check("harmless", "bfloat16", args.model, dtype="bfloat16")
    if not args.no_builds:
        for name, flags in BUILDS.items():
            t0 = time.perf_counter()
            rows.append(("harmless", name, _forced_build(args.model, config, flags)))
            print(f"# {name}: {time.perf_counter() - t0:.0f} s", flush=True)
    converted, fidelity = ssacli.convert(copy.deepcopy(base), args.convert)
    kl = fidelity.get("kl_per_token")
    check("harmless", f"its own SSA conversion (`{args.convert}`, no fine-tuning; KL {kl:.3g})", converted)
    for other in args.also:
        check("harmless", f"`{other}`", other)
    for name, damage in DAMAGE.items():
        damaged = copy.deepcopy(base)
        damage(damaged.model)
        check("damage", name, damaged)
    gates = requires
    print(f"\n{args.model}: gates from `ssacli check --init` (seeds 0–2), {len(gates)} active\n")
    print("| change | kind | " + " | ".join(f"`{g}`" for g in gates) + " | check |")
    print("|---|---|" + "---|" * len(gates) + "---|")
    for kind, name, cells in rows:
        shown = [f"{cells[g][0]:.4g} {'✓' if cells[g][1] else '✗'}" if g in cells else "–" for g in gates]
        verdict = "pass" if all(cells[g][1] for g in gates if g in cells) else "**FAIL**"
        print(f"| {name} | {kind} | " + " | ".join(shown) + f" | {verdict} |")
    print("\nWhat each gate catches (damage rows that fail it):")
    for gate in gates:
        caught = [
            name for kind, name, cells in rows if kind == "damage" and gate in cells and not cells[gate][1]
        ]
        print(f"- `{gate}`: {', '.join(caught) or 'none of these'}")
    print(f"\n({time.perf_counter() - started:.0f} s in all)")


if __name__ == "__main__":
    main()
