"""The files the main job's data passes through: ``diagnose_with(settings)`` to the ``DiagnoseResult``
and its JSON, measured (docs/architecture.md, "The main job, file by file").

    python scripts/trace_files.py [MODEL ...] [--stats eager|fused|auto] [--why]

Default: the two bundled models (the ICL model diagnose runs without MODEL, and the language model;
their files together) and ``--stats auto``; ``--why`` names the event that first counted each file.
The last line counts, for comparison, every ssacli file any function of which ran (loading aside).
A tiny run (two samples of 16 tokens, logit-scale at two levels) crosses every stage.

A file counts when one of its functions is on the Python call stack at a moment the data changes
hands: where a stage's value is made (a function returns, or a constructor builds, for the first
time, an instance of a class of ssacli.diagnosis — the plan, the observer, the per-layer sums, a
probe's or the run's result — or the kernels' row statistics; not a constant or a spec: an enum, a
frozen dataclass), where the statistics become metrics (``row_sums``, ``logit_sums``) and where the
JSON is written (``to_json``). Helpers that return something else (a mask, a tensor, a float) or
hand on a value made before are no hops. Nor are the files below the outermost statistics kernel
on the stack (ssacli/kernels/: the native library's insides are that kernel's), nor the model's own
code (a method of an nn.Module: transformers' for most models, ssacli/models/icl.py for the ICL
ones, the scorer). The files print in the order the run first enters them: the order to read them.
"""

from __future__ import annotations

import enum
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ANCHORS = {"row_sums", "logit_sums", "to_json"}  # where the statistics become metrics; the JSON
# the bundled ICL model (the default MODEL) and the bundled language model: the two kinds of input
BUNDLED = ("builtin:every-softmax", "builtin:wikitext-softmax")
KERNEL = "kernels/"  # the statistics kernels: entered once, their insides are the kernel's (not hops)


def stage_value(value) -> bool:
    """A value the job measured or is measuring: an instance of a class of ssacli.diagnosis (the plan,
    the observer, per-layer sums, a probe's or the run's result) or the kernels' row statistics.
    Constants and specs are not (enums, frozen dataclasses: a probe kind, a parsed probe, the route)."""
    if isinstance(value, tuple):  # (output, statistics) and the like
        return any(stage_value(v) for v in value)
    kind = type(value)
    if isinstance(value, enum.Enum) or getattr(getattr(kind, "__dataclass_params__", None), "frozen", False):
        return False
    return kind.__module__.startswith("ssacli.diagnosis.") or kind.__name__ == "RowStatistics"


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    stats = sys.argv[sys.argv.index("--stats") + 1] if "--stats" in sys.argv else "auto"
    models = [a for a in args if a != stats] or list(BUNDLED)

    from torch.nn import Module

    from ssacli.diagnosis.run import diagnose_with
    from ssacli.diagnosis.settings import DiagnoseSettings
    from ssacli.models.loading import as_loaded
    from ssacli.models.options import LoadOptions

    settings = DiagnoseSettings(samples=2, length=16, probes=["logit-scale:1,8"], stats=stats)
    pkg = str(ROOT / "ssacli") + "/"
    first_entered: dict[str, int] = {}
    crossed: set[str] = set()
    made: dict[int, object] = {}  # the values already made: handing one on again makes nothing
    why: dict[str, str] = {}  # --why: the first event that counted each file

    def rel(frame) -> str:
        return frame.f_code.co_filename[len(pkg) :]

    def stack(frame, event: str) -> None:
        frames = []
        while frame is not None:
            # a method of an nn.Module is the model being measured (or its scorer), not a hop: the
            # transformers model's code is not ssacli's, and an ICL model's (models/icl.py) is no more one
            model_code = isinstance(frame.f_locals.get("self"), Module)
            if frame.f_code.co_filename.startswith(pkg) and not model_code:
                frames.append((rel(frame), frame.f_code.co_name))
            frame = frame.f_back
        # below the outermost kernel file on the stack is that kernel's inside
        outer = max((i for i, (name, _) in enumerate(frames) if name.startswith(KERNEL)), default=0)
        for name, function in frames[outer:]:
            crossed.add(name)
            why.setdefault(name, f"{function} (on the stack at {event})")

    def profile(frame, event, arg):
        if not frame.f_code.co_filename.startswith(pkg):
            return
        if event == "call":
            first_entered.setdefault(rel(frame), len(first_entered))  # every file that ran
            if frame.f_code.co_name in ANCHORS:
                stack(frame, f"{rel(frame)}:{frame.f_code.co_name}")
            return
        if event != "return":
            return
        if frame.f_code.co_name in ("__init__", "__post_init__"):  # a constructor makes its self
            arg = frame.f_locals.get("self")
        if stage_value(arg) and id(arg) not in made:
            made[id(arg)] = arg  # kept alive, so that no later value reuses its id
            stack(frame, f"{rel(frame)}:{frame.f_code.co_name} -> {type(arg).__name__}")

    for model in models:
        loaded = as_loaded(model, None, LoadOptions())  # loading is not the job's data
        sys.setprofile(profile)
        try:
            diagnose_with(loaded, settings).to_json()
        finally:
            sys.setprofile(None)
    ordered = sorted(crossed, key=first_entered.__getitem__)
    print(f"files the diagnose data crosses ({', '.join(models)}; {stats} statistics): {len(ordered)}")
    for i, name in enumerate(ordered, 1):
        print(f"{i:3d}. ssacli/{name}" + (f"  [{why[name]}]" if "--why" in sys.argv else ""))
    print(f"ssacli files with a function that ran: {len(first_entered)}")


if __name__ == "__main__":
    main()
