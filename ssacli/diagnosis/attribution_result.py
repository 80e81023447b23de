"""The values of :func:`ssacli.diagnosis.attribution.attribute`: what it patches and measures
(:class:`AttributionSettings`, checked when built; the probe, :func:`check_probe`) and what it
returns (one probe level's damage and what the attention patterns of head sets carry of it, as a
versioned JSON document (:meth:`Attribution.to_dict`, :meth:`Attribution.from_dict`,
:meth:`Attribution.load`), a table (:meth:`Attribution.to_frame`) and a few lines of text
(:meth:`Attribution.lines`)). Torch-free: ``ssacli attribute`` checks its settings and its probe here
before the model stack loads."""

from __future__ import annotations

import re
import textwrap
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError, UnsupportedModelError, UsageError
from .attribution_settings import AttributionSettings, Head
from .probe_kinds import ActsOn, Probe, ProbeKind, parse_probe

SCHEMA = "ssacli-attribution"  # the document of Attribution.to_dict (`ssacli attribute --json`)
SCHEMA_VERSION = 1
SCHEMA_FILE = Path(__file__).with_name("attribution.schema.json")  # JSON Schema (2020-12) of to_dict()
WIDTH = 80  # columns of Attribution.lines()

# The plan's reading (docs/results/saturation-matters-plan.md, committed before any run): collapse
# marks the heads that carry the damage only where the chosen set beats this share of random sets …
NULL_BEATS = 95.0
# … and does not mark them where the set sits inside this central share of the null
NULL_CENTRAL = 90.0
READINGS = {
    "marks": "collapse marks the heads that carry the damage",
    "does not mark": "collapse does not mark the heads that carry the damage",
    "undecided": "undecided at this budget",
}


# Probes whose prompt j is the same tokens at every level (length: windows of the long rows, patching.py)
KEEPS_TOKENS = (ActsOn.EMBEDDINGS, ActsOn.KEYS, ActsOn.LOGITS, ActsOn.INPUT_LENGTH)


def unshifted(kind: ProbeKind) -> float:
    """The level a probe changes nothing at: its neutral level, and ×1 for ``length`` (the base)."""
    return 1.0 if kind.acts_on is ActsOn.INPUT_LENGTH else kind.neutral


def check_probe(
    probe: str | Probe, level: float | None = None, remedy: tuple[float, ...] = ()
) -> tuple[Probe, float]:
    """The probe an attribution runs and its shifted level (default: the last level other than the
    unshifted one), or a UsageError before any model loads: the probe must keep the tokens (prompt j
    the same at every level) and hold the unshifted level, which is patched back; a temperature
    ``remedy`` is no remedy for ``logit-scale``, which it undoes exactly (T = α)."""
    probe = probe if isinstance(probe, Probe) else parse_probe(probe)
    kind = probe.kind
    if remedy and probe.name == "logit-scale":
        raise UsageError(
            "a temperature remedy undoes logit-scale exactly (T = α divides back what α multiplied): "
            "measure it under key-scale, dominant-key, embed-scale, outlier or length"
        )
    if kind.acts_on not in KEEPS_TOKENS:
        raise UsageError(
            f"attribution needs a probe whose prompts are the same tokens at every level (key-scale, "
            f"logit-scale, dominant-key, embed-scale, outlier, length), not '{probe.name}'"
        )
    base = unshifted(kind)
    if base not in probe.levels:
        raise UsageError(
            f"attribution patches the unshifted level back: give it, e.g. {probe.name}:"
            f"{base:g},{probe.levels[-1]:g}"
        )
    if level is None:
        others = [v for v in probe.levels if v != base]
        return probe, others[-1] if others else base
    if level not in probe.levels:
        raise UsageError(f"level {level:g} is not among {probe}'s levels; add it to the probe")
    return probe, level


def check_prompts(kind: ProbeKind, inputs_given: bool, random_ids: bool) -> None:
    """Refuse, before any model loads, prompts a probe of ``kind`` cannot patch: ``length``'s long
    rows are consecutive base prompts only when cut from one text."""
    if kind.acts_on is ActsOn.INPUT_LENGTH and (inputs_given or random_ids):
        raise UsageError("attribution under 'length' needs text: its windows are the base prompts only when "
                         "cut from one text (drop inputs= and random_ids)")  # fmt: skip


def not_causal(kind: str) -> UnsupportedModelError:
    """A model of ``kind`` (a :class:`~ssacli.models.kinds.ModelKind` value) given to attribution."""
    return UnsupportedModelError(
        f"attribution measures the next-token loss: causal LMs only, not {kind} models"
    )


def check_model(ref: str, settings: AttributionSettings) -> None:
    """Refuse, before the model stack loads, what a local MODEL folder's files tell: a kind other
    than causal (:func:`~ssacli.models.kinds.declared_kind`), a head of ``settings.heads`` beyond the
    layers or heads its config.json declares, a ``k`` above the heads it declares
    (:func:`~ssacli.models.declared_attention.declared_attention`: bounds; the exact counts are
    checked once the model has loaded). A Hub id, or what the files do not tell, is left to loading."""
    from ..models.declared_attention import declared_attention
    from ..models.kinds import ModelKind, declared_kind
    from ..models.references import local_model_path

    path = local_model_path(ref)
    if path is None or not path.is_dir():
        return
    kind = declared_kind(path)
    if kind not in (None, ModelKind.CAUSAL):
        raise not_causal(kind.value)
    declared = declared_attention(path)
    if declared is None:
        return
    layers, heads = declared
    shape = f"its config.json declares {layers} layers of {heads} heads, L0H0 to L{layers - 1}H{heads - 1}"
    for layer, head in settings.heads or ():
        if layer >= layers or head >= heads:
            raise UsageError(f"head L{layer}H{head} is not in '{ref}': {shape}; give heads in that range, "
                             "counted from 0")  # fmt: skip
    if settings.heads is None and settings.k > layers * heads:
        raise UsageError(f"k must be at most the model's {layers * heads} heads, got {settings.k} ({shape})")


def parse_heads(text: str) -> list[Head]:
    """``"L2H1,L3H0"`` (the names :meth:`Attribution.lines` prints) as [(2, 1), (3, 0)]."""
    heads = []
    for name in text.split(","):
        match = re.fullmatch(r"\s*L(\d+)H(\d+)\s*", name, flags=re.IGNORECASE)
        if match is None:
            raise UsageError(f"head '{name.strip()}' is not a head name; give L<layer>H<head>, comma-"
                             "separated and counted from 0, e.g. L2H1,L3H0")  # fmt: skip
        heads.append((int(match[1]), int(match[2])))
    return heads


@dataclass
class SetAttribution:
    """The damage one head set's unshifted patterns removed, measured on ``measured_on``'s prompts."""

    heads: list[Head]
    chosen_on: list[int] | None  # prompts the set was chosen on (None: given, or every head)
    measured_on: list[int]
    removed: list[float]  # per measured prompt: loss(shifted) − loss(shifted, S patched)
    mean: float
    interval: tuple[float, float] | None  # 95 % bootstrap interval over the measured prompts
    damage: float  # the mean damage over the same prompts
    damage_interval: tuple[float, float] | None
    share: float | None  # mean / damage, only where the damage's interval excludes 0
    null: list[float] = field(default_factory=list)  # mean removed by each random layer-matched set
    percentile: float | None = None  # where ``mean`` falls in ``null`` (100: above every random set)
    per_head: dict[str, float] = field(default_factory=dict)  # "L3H2" -> mean removed alone
    # the remedy, not attribution: per temperature T, {"temperature", "removed", "interval"}: the damage
    # removed by tempering the set's heads (weights^(1/T), renormalized) at the shifted level
    remedy: list[dict[str, Any]] = field(default_factory=list)

    @property
    def parts_sum(self) -> float | None:
        """What the set's heads removed one at a time, summed (beside ``mean``: self-repair)."""
        return float(sum(self.per_head.values())) if self.per_head else None

    @property
    def reading(self) -> str | None:
        """The plan's reading of a set against its null (docs/results/saturation-matters-plan.md):
        "marks" where the removed damage's interval excludes 0 (above it) and the set beats at least
        NULL_BEATS of the random sets, "does not mark" where it sits in the null's central
        NULL_CENTRAL, else "undecided"; None without a null."""
        if self.percentile is None:
            return None
        if self.interval is not None and self.interval[0] > 0 and self.percentile >= NULL_BEATS:
            return "marks"
        low = (100 - NULL_CENTRAL) / 2
        return "does not mark" if low <= self.percentile <= 100 - low else "undecided"


@dataclass
class Attribution:
    """One probe level's damage and what attention patterns carry of it (:func:`attribute`)."""

    model: str
    probe: str
    level: float
    reference_level: float
    k: int
    layers: list[str]
    heads: list[int]
    loss_reference: list[float]  # per prompt, unshifted
    loss_shifted: list[float]
    damage: list[float]  # per prompt: shifted − unshifted
    damage_interval: tuple[float, float] | None
    rise: list[list[float]]  # [layer][head] collapse rise over every prompt (NaN: collapsed unshifted)
    sets: list[SetAttribution]  # chosen on half A measured on B, and the reverse; or the given set
    ceiling: SetAttribution | None  # every head patched (None: not asked for)
    elapsed_s: float
    settings: dict[str, Any]
    # per prompt: the fresh collapse rate (a share of the rows of the heads not collapsed unshifted,
    # the heads ``rise`` leaves out), unshifted and shifted; empty in files written before them
    collapse_reference: list[float] = field(default_factory=list)
    collapse_shifted: list[float] = field(default_factory=list)
    # Spearman's ρ over prompts of the collapse change against the damage, with its interval
    # ({"rho", "interval", "prompts"}); None where undefined or not measured
    association: dict[str, Any] | None = None

    @property
    def reading(self) -> str | None:
        """What the attribution as a whole supports: the chosen sets' common reading where every half
        reads the same, else "undecided" (the halves disagree: on SmolLM2-135M under key-scale:8 the
        same four heads, chosen on either half, beat 59 % of the random sets on one half and 97 %
        on the other, docs/results/saturation-matters.md); None without chosen sets or a null."""
        readings = {one.reading for one in self.sets if one.chosen_on is not None}
        if not readings or None in readings:
            return None
        return readings.pop() if len(readings) == 1 else "undecided"

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (NaN as None) under ``schema``/``schema_version``, each set with its
        :attr:`~SetAttribution.reading` and the whole its :attr:`reading`; :meth:`from_dict` reads it
        back (both readings computed again, not read)."""
        out = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, **asdict(self), "reading": self.reading}
        for one, kept in zip([*self.sets, self.ceiling], [*out["sets"], out["ceiling"]], strict=True):
            if kept is not None:
                kept["reading"] = one.reading
        return _jsonable(out)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Attribution:
        """The result :meth:`to_dict` wrote (an InputError in one line for anything else)."""
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            schema = data.get("schema") if isinstance(data, dict) else None
            raise InputError(f"not an ssacli attribution (schema={schema!r}); give a file written by "
                             "`ssacli attribute --json`")  # fmt: skip
        if data.get("schema_version", 0) > SCHEMA_VERSION:
            raise InputError(f"attribution written by a newer ssacli (schema {data['schema_version']}); "
                             "upgrade ssacli")  # fmt: skip
        try:
            values = {f.name: data[f.name] for f in fields(cls) if f.name in data or not _optional(f)}
            values["damage_interval"] = _pair(values["damage_interval"])
            values["rise"] = [[np.nan if v is None else v for v in row] for row in values["rise"]]
            values["sets"] = [_set(one) for one in values["sets"]]
            values["ceiling"] = None if values["ceiling"] is None else _set(values["ceiling"])
            return cls(**values)
        except KeyError as err:
            raise InputError(f"attribution without its field {err.args[0]!r}: it was edited or cut short; "
                             "re-create it with `ssacli attribute --json`") from None  # fmt: skip
        except (TypeError, ValueError, AttributeError) as err:
            raise InputError(
                f"malformed attribution ({err}); re-create it with `ssacli attribute --json`"
            ) from None

    @classmethod
    def load(cls, path: str | Path) -> Attribution:
        """A file written by ``ssacli attribute --json``; every problem is one InputError line."""
        from .result import read_json_file  # the one reader of result files

        if not Path(path).is_file():
            raise InputError(
                f"attribution file '{path}' does not exist; write one with `ssacli attribute --json`"
            )
        try:
            return cls.from_dict(read_json_file(path))
        except InputError as err:
            raise InputError(f"{err}" if str(path) in str(err) else f"result file '{path}': {err}") from None

    def to_frame(self):
        """One row per measured set (the chosen or given sets, then the ceiling) as a pandas DataFrame:
        its heads, the prompts it was chosen and measured on, the damage it removed with its
        interval, the damage, the share, its percentile in the null and the reading (NaN / None where
        not measured). ``pip install "ssacli[frame]"``."""
        import pandas as pd

        rows = []
        for one in [*self.sets, *([self.ceiling] if self.ceiling else [])]:
            low, high = one.interval or (np.nan, np.nan)
            rows.append({
                "set": "ceiling" if one is self.ceiling else "given" if one.chosen_on is None else
                       f"chosen on {len(one.chosen_on)}",
                "heads": _names(one.heads), "measured_on": len(one.measured_on), "removed": one.mean,
                "removed_low": low, "removed_high": high, "damage": one.damage,
                "share": np.nan if one.share is None else one.share,
                "percentile": np.nan if one.percentile is None else one.percentile,
                "null": len(one.null), "reading": one.reading,
            })  # fmt: skip
        frame = pd.DataFrame(rows)
        frame.insert(0, "level", self.level)
        frame.insert(0, "probe", self.probe)
        return frame

    def lines(self) -> list[str]:
        """The result in a few lines of at most :data:`WIDTH` columns (long head lists wrap)."""
        mean = float(np.mean(self.damage))
        out = [
            f"{self.probe} at {self.level:g} against {self.reference_level:g}, {len(self.damage)} prompts",
            f"  damage {mean:+.4f} nats/token {_interval(self.damage_interval)}",
        ]
        if self.association is not None:
            rho, interval = self.association["rho"], self.association["interval"]
            bracket = "(no interval)" if interval is None else f"[{interval[0]:+.2f}, {interval[1]:+.2f}]"
            out += _wrap(f"per prompt, collapse change vs damage: Spearman ρ {rho:+.2f} {bracket} "
                         "(a correlation)", "  ")  # fmt: skip
        for one in [*self.sets, *([self.ceiling] if self.ceiling else [])]:
            if one is self.ceiling:
                out.append("  every head (the ceiling: what attention patterns carry at all)")
            elif one.chosen_on is None:
                out += _wrap(f"{_names(one.heads)} (given)", "  ")
            else:
                where = f"top {len(one.heads)} by collapse rise on {len(one.chosen_on)} prompts"
                out += _wrap(f"{_names(one.heads)} ({where})", "  ")
            share = "" if one.share is None else f", {one.share:.0%} of the damage"
            on = f" on {len(one.measured_on)} prompts" if one.chosen_on is not None else ""
            out += _wrap(f"removes {one.mean:+.4f} {_interval(one.interval)}{on}{share}", "    ")
            if one.percentile is not None:
                out.append(f"    beats {one.percentile:.0f}% of {len(one.null)} random layer-matched sets")
                out.append(f"    {READINGS[one.reading]}")
            if one.per_head:
                alone = ", ".join(f"{h} {v:+.4f}" for h, v in one.per_head.items())
                out += _wrap(f"alone: {alone}", "    ")
            if one.remedy:
                doses = ", ".join(f"T={r['temperature']:g} {r['removed']:+.4f}" for r in one.remedy)
                out += _wrap(f"remedy, not attribution: {doses}", "    ")  # T on these heads
        chosen = [one for one in self.sets if one.chosen_on is not None]
        if len(chosen) > 1 and self.reading is not None:
            agree = "the halves agree" if len({one.reading for one in chosen}) == 1 else "the halves disagree"
            out += _wrap(f"both halves: {READINGS[self.reading]} ({agree})", "  ")
        return out


def _optional(one) -> bool:
    """A field with a default: absent from files written before it was added."""
    from dataclasses import MISSING

    return one.default is not MISSING or one.default_factory is not MISSING


def _wrap(text: str, indent: str) -> list[str]:
    """``text`` in lines of at most WIDTH columns, each at ``indent``, continuations two further in."""
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_on_hyphens=False)  # fmt: skip


def _pair(value: Any) -> tuple[float, float] | None:
    return None if value is None else (float(value[0]), float(value[1]))


def _set(data: dict[str, Any]) -> SetAttribution:
    """One set of a saved attribution (its ``reading`` is computed again, not read)."""
    values = {f.name: data[f.name] for f in fields(SetAttribution)}
    values["heads"] = [(int(layer), int(head)) for layer, head in values["heads"]]
    values["interval"] = _pair(values["interval"])
    values["damage_interval"] = _pair(values["damage_interval"])
    values["remedy"] = [{**dose, "interval": _pair(dose["interval"])} for dose in values["remedy"]]
    return SetAttribution(**values)


def _names(heads: list[Head]) -> str:
    return " ".join(f"L{layer}H{head}" for layer, head in heads)


def _interval(interval: tuple[float, float] | None) -> str:
    return "" if interval is None else f"[{interval[0]:+.4f}, {interval[1]:+.4f}]"


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


__all__ = [
    "KEEPS_TOKENS", "SCHEMA", "SCHEMA_FILE", "SCHEMA_VERSION", "WIDTH", "Attribution",
    "AttributionSettings", "Head", "SetAttribution", "check_probe", "parse_heads", "unshifted",
]  # fmt: skip
