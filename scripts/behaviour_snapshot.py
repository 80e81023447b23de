"""Snapshot what ssacli computes, to show a refactor changed nothing (docs/architecture.md).

    python scripts/behaviour_snapshot.py capture DIR      # on the tree before the change
    python scripts/behaviour_snapshot.py capture DIR2     # on the tree after
    python scripts/behaviour_snapshot.py compare DIR DIR2

``capture`` records (1) ``ssacli diagnose`` on every bundled model — terminal text at 80 columns,
the JSON result and the HTML report — with the default statistics, forced eager statistics and a
re-scored SSA run; (2) for every model family of the installed transformers, the audit's verdict
and relative difference, and the logits of the tiny model under ``apply_scorer(.., "softmax")`` and
``"ssa:share=layer"``; (3) diagnose's per-layer, per-head metrics on the families with an exactness
test and the eager-fallback families. ``compare`` prints every difference: texts and HTML line by
line with timings masked, JSON numbers exactly (timings aside), tensors as max |a - b|, and exits 1
if any text differs or any tensor differs by more than 1e-7. What only the later snapshot has (a new
JSON field, inserted lines: a new metric or section) is listed apart and is not a difference.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

TIMING = re.compile(r"\d+(\.\d+)?\s*(s|ms|min)\b|elapsed[^<\n]*|\d+:\d\d(:\d\d)?")
BUILTINS = ("every-softmax", "every-ssa", "linear-softmax", "linear-ssa", "wikitext-softmax", "wikitext-ssa")
RUNS = {  # name -> extra diagnose arguments
    "default": [],
    "eager": ["--stats", "eager"],
    "ssa": ["--scorer", "ssa:init=faithful,m=64", "--probe", "logit-scale:1,8,32", "--probe", "length:1,2"],
}
TOLERANCE = 1e-7


def capture(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, COLUMNS="80", NO_COLOR="1", TERM="dumb")
    for name in BUILTINS:
        for run, extra in RUNS.items():
            stem = out / f"diagnose-{name}-{run}"
            cmd = [
                "ssacli",
                "diagnose",
                f"builtin:{name}",
                "--json",
                f"{stem}.json",
                "--html",
                f"{stem}.html",
            ]
            if name.split("-")[0] in ("every", "linear") and os.environ.get("SNAPSHOT_ICL_LENGTH"):
                extra = [*extra, "--length", os.environ["SNAPSHOT_ICL_LENGTH"]]  # a changed default, pinned
            done = subprocess.run(cmd + extra, capture_output=True, text=True, env=env)
            Path(f"{stem}.txt").write_text(f"rc={done.returncode}\n{done.stdout}\n{done.stderr}")
            print(f"{stem.name}: rc={done.returncode}", flush=True)
    families(out)


def families(out: Path) -> None:
    import torch

    import ssacli

    try:  # the layout since the restructure (issue 23)
        from ssacli.diagnosis.routes import FALLBACK_FAMILIES
        from ssacli.testing.audit import audit_family, padded_batch, run
        from ssacli.testing.tiny_models import build_tiny, model_kind
        from ssacli.testing.tiny_models import families as all_families
    except ImportError:  # before it
        from ssacli.attention.audit import (  # type: ignore[no-redef]
            FALLBACK_FAMILIES,
            audit_family,
            build_tiny,
            model_kind,
            padded_batch,
            run,
        )
        from ssacli.attention.tiny_models import families as all_families  # type: ignore[no-redef]
    from ssacli.attention.interface import TESTED_FAMILIES

    verdicts, tensors, metrics = {}, {}, {}
    for family, kind in sorted(all_families().items()):
        result = audit_family(family, kind)
        verdicts[family] = {"status": result.status, "difference": result.difference}
        if result.status != "exact":
            continue
        model = build_tiny(family, kind)
        kind = model_kind(model, kind)
        ids, mask = padded_batch(kind)
        for spec in ("softmax", "ssa:share=layer"):
            try:
                scored = ssacli.apply_scorer(copy.deepcopy(model), spec)
                tensors[f"{family}/{spec}"] = run(scored, kind, ids, mask)[0].detach()
            except Exception as err:  # noqa: BLE001 - recorded, compared as text
                verdicts[family][spec] = f"{type(err).__name__}: {err}"[:200]
        if family in TESTED_FAMILIES or family in FALLBACK_FAMILIES:
            for stats in ("eager", "auto"):
                metrics[f"{family}/{stats}"] = _diagnose_metrics(model, ids, stats)
    for family in sorted(FALLBACK_FAMILIES):
        kind = all_families().get(family)
        if kind is None:
            continue
        try:
            model = build_tiny(family, kind)
            ids, _ = padded_batch(model_kind(model, kind))
            metrics[f"{family}/fallback"] = _diagnose_metrics(model, ids, "auto")
        except Exception as err:  # noqa: BLE001
            metrics[f"{family}/fallback"] = f"{type(err).__name__}: {err}"[:200]
        print(f"fallback {family}", flush=True)
    (out / "families.json").write_text(json.dumps({"verdicts": verdicts, "metrics": metrics}, indent=1))
    torch.save(tensors, out / "families.pt")


def _diagnose_metrics(model, ids, stats: str):
    import ssacli

    try:
        result = ssacli.diagnose(
            model,
            ["logit-scale:1,32", "dominant-key:1,32"],
            inputs=ids[:1].tolist() * 2,
            stats=stats,
            samples=2,
        )
    except Exception as err:  # noqa: BLE001
        return f"{type(err).__name__}: {err}"[:200]
    data = result.to_dict()
    return _untimed(data)


def _untimed(data):
    if isinstance(data, dict):
        return {
            k: _untimed(v)
            for k, v in data.items()
            if "elapsed" not in k and "seconds" not in k and k != "timings"
        }
    if isinstance(data, list):
        return [_untimed(v) for v in data]
    return data


ADDED = -1.0  # _numbers' mark of a key only the later snapshot has (a new field, not a change)


def _numbers(a, b, path=""):
    """Yield (path, |a-b|, None for a structural difference, or ADDED for a key only ``b`` has)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in b:
                yield f"{path}/{key}", None
            elif key not in a:
                yield f"{path}/{key}", ADDED
            else:
                yield from _numbers(a[key], b[key], f"{path}/{key}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from _numbers(x, y, f"{path}[{i}]")
    elif isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        if a != b:
            yield path, abs(a - b) if a == a and b == b else (0.0 if (a != a and b != b) else None)
    elif a != b:
        yield path, None


def compare(a: Path, b: Path) -> int:
    import torch

    bad = 0
    for left in sorted(a.glob("diagnose-*")):
        right = b / left.name
        if not right.exists():
            print(f"missing in {b}: {left.name}")
            bad += 1
            continue
        if left.suffix == ".json":
            diffs = list(
                _numbers(_untimed(json.loads(left.read_text())), _untimed(json.loads(right.read_text())))
            )
            added = [p for p, d in diffs if d == ADDED]
            changed = [(p, d) for p, d in diffs if d != ADDED]
            worst = max((d for _, d in changed if d is not None), default=0.0)
            structural = [p for p, d in changed if d is None]
            print(
                f"{left.name}: {len(changed)} differing values, max {worst:.3g}, {len(structural)} "
                f"structural; {len(added)} added fields"
            )
            bad += bool(structural) or worst > TOLERANCE
            for p in structural[:5] + added[:3]:
                print(f"  {p}")
        else:
            ta = [TIMING.sub("<t>", line) for line in left.read_text().replace(str(a), "<dir>").splitlines()]
            tb = [TIMING.sub("<t>", line) for line in right.read_text().replace(str(b), "<dir>").splitlines()]
            # inserted lines (a new section) are listed apart; a changed or removed line is a difference
            ops = difflib.SequenceMatcher(None, ta, tb, autojunk=False).get_opcodes()
            changed = [
                (i1, j1, ta[i1:i2], tb[j1:j2]) for tag, i1, i2, j1, j2 in ops if tag in ("replace", "delete")
            ]
            inserted = sum(j2 - j1 for tag, _, _, j1, j2 in ops if tag == "insert")
            if changed or inserted:
                print(f"{left.name}: {sum(len(x) for *_, x, _ in changed)} changed or removed lines, "
                      f"{inserted} inserted ({len(ta)} vs {len(tb)} lines)")  # fmt: skip
                bad += bool(changed)
                for i, j, x, y in changed[:3]:
                    print(f"  {i}: {' | '.join(x)[:150]}\n  {j}: {' | '.join(y)[:150]}")
    if not (a / "families.json").exists() or not (b / "families.json").exists():
        print("families: not in both snapshots (not compared)")
        return bad
    fa, fb = json.loads((a / "families.json").read_text()), json.loads((b / "families.json").read_text())
    for section in ("verdicts", "metrics"):
        diffs = list(_numbers(fa[section], fb[section]))
        worst = max((d for _, d in diffs if d is not None), default=0.0)
        structural = [p for p, d in diffs if d is None]
        print(
            f"families {section}: {len(fa[section])} entries, max difference {worst:.3g}, "
            f"{len(structural)} structural"
        )
        for p in structural[:10]:
            print(f"  {p}")
        bad += bool(structural) or worst > TOLERANCE
    ta, tb = torch.load(a / "families.pt"), torch.load(b / "families.pt")
    worst, where = 0.0, ""
    for key in sorted(set(ta) | set(tb)):
        if key not in ta or key not in tb:
            print(f"family tensor missing: {key}")
            bad += 1
            continue
        d = (ta[key].double() - tb[key].double()).abs().max().item()
        if d > worst:
            worst, where = d, key
    print(f"family logits: {len(ta)} tensors, max |a - b| {worst:.3g} ({where or 'all equal'})")
    bad += worst > TOLERANCE
    print("IDENTICAL (within 1e-7)" if not bad else f"{bad} DIFFERENCES")
    return int(bool(bad))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("capture", "compare", "families"))
    parser.add_argument("dirs", nargs="+", type=Path)
    args = parser.parse_args()
    if args.action == "capture":
        capture(args.dirs[0])
    elif args.action == "families":
        args.dirs[0].mkdir(parents=True, exist_ok=True)
        families(args.dirs[0])
    else:
        return compare(args.dirs[0], args.dirs[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
