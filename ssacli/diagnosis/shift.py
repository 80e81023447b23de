"""Natural shifts as probes: the user's own text is the in-distribution reference
(``--text``; the built-in texts without it) and a shifted corpus (``--shift FILE``: another domain,
another language, code, long numbers, …) the probe, both cut into documents of one length.

The ``shift`` probe has two levels, 0 (the reference's documents) and 1 (the shifted corpus's), so
the verdicts, tables, JSON and HTML read it as any other probe; :func:`shift_summary` adds what a
natural shift asks per document, with 95 % bootstrap intervals over documents
(:func:`ssacli.stats.bootstrap_difference_ci`: the two corpora's documents are no pairs, so both
sides are resampled):

* the **saturation change**: each shifted document's fresh collapse rate (the heads collapsed on
  the reference excluded: ``ProbeResult.prompt_collapse``) minus the reference documents' mean;
* the **output damage**: each shifted document's next-token loss (nats per token) minus the
  reference documents' mean loss. A loss increase mixes the shifted text's own difficulty (code or
  digits are harder to predict whatever attention does) with damage, so it is given as a
  distribution over documents, never as a verdict;
* their **association**: Spearman's ρ over the shifted documents of the saturation change against
  the damage, with its bootstrap interval (the pairs resampled together): whether the documents
  that saturate more are the ones the model predicts worse. A correlation, not a cause: the causal
  measure is ``ssacli attribute`` (pattern patching), which needs the same tokens at both levels.

Documents (:func:`windows`): each corpus is tokenized whole (no special tokens) and cut into
consecutive non-overlapping windows of the base length L (``--length``, capped at the model's
positions), less the tokenizer's special prefix (``<bos>`` where it adds one), which starts every
document; n = min(samples, windows of either corpus) documents are taken from each, evenly spaced
through it (window ⌊i·W/n⌋, i = 0 … n−1, of its W windows), so a long corpus is sampled across
its length and identical texts give identical documents. A corpus shorter than one window is
refused. Every document is L tokens: the level's loss and collapse rate are the means of the
documents' own.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import UsageError
from ..stats import LEVEL, bootstrap_difference_ci, spearman_ci
from .probe_kinds import ActsOn, Probe, parse_probe
from .probe_result import ProbeResult
from .settings import DiagnoseSettings
from .texts import TEXTS, special_prefix

SPLIT = "consecutive non-overlapping windows of the base length, evenly spaced through each corpus"


def windows(stream: list[int], length: int, count: int, prefix: list[int] = ()) -> list[list[int]]:
    """``count`` windows of ``length`` tokens, evenly spaced over the stream's whole windows, each
    starting with ``prefix`` (the tokenizer's :func:`~ssacli.diagnosis.texts.special_prefix`)."""
    prefix = list(prefix)[: max(0, length - 1)]
    size = length - len(prefix)
    total = len(stream) // size
    return [prefix + stream[w * size : (w + 1) * size] for w in (i * total // count for i in range(count))]


class ShiftCorpus:
    """The two corpora's documents (level 0: reference, level 1: shifted), matched in length and
    count; a corpus too short for one document is a UsageError naming it."""

    def __init__(
        self, tokenizer, reference: str | None, shifted: str, name: str, length: int, samples: int
    ) -> None:
        where = "the --text file" if reference is not None else "the built-in texts"
        streams, prefix = [], special_prefix(tokenizer)
        size = max(1, length - len(prefix))  # each document: the prefix, then size tokens of its corpus
        sides = ((reference or "\n\n".join(TEXTS), where), (shifted, f"the --shift corpus '{name}'"))
        for text, what in sides:
            stream = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
            if len(stream) < size:
                raise UsageError(
                    f"{what} has {len(stream)} tokens, fewer than one document of {size}; give a "
                    "longer file or a smaller --length"
                )
            streams.append(stream)
        count = min(samples, *(len(s) // size for s in streams))
        self.documents = {level: windows(s, length, count, prefix) for level, s in zip((0.0, 1.0), streams)}
        self.note = None
        if count < samples:
            short = f"the shorter corpus holds {count} of {length} tokens"
            self.note = f"{count} documents per corpus, not {samples}: {short}"
        self.description = {
            "name": name, "reference": where, "documents": count, "tokens": length,
            "split": SPLIT, "windows": [len(s) // size for s in streams],
        }  # fmt: skip

    def sequences(self, level: float) -> list[list[int]]:
        return self.documents[float(level)]


def with_shift(probes: list[Probe], settings: DiagnoseSettings) -> list[Probe]:
    """The probes with the ``shift`` probe last where a shifted corpus is given; the probe without
    one is refused (before the model loads)."""
    corpus = [p for p in probes if p.kind.acts_on is ActsOn.INPUT_CORPUS]
    if settings.shift is None:
        if corpus:
            name = corpus[0].name
            raise UsageError(f"probe '{name}' needs a shifted corpus; give --shift FILE (shift= in the API)")
        return probes
    return probes if corpus else [*probes, parse_probe("shift")]


def is_shift(probe: ProbeResult) -> bool:
    return probe.kind is not None and probe.kind.acts_on is ActsOn.INPUT_CORPUS


def shift_summary(probe: ProbeResult) -> dict[str, Any] | None:
    """Per document, the output damage (``loss``) and the saturation change (``collapse``: fresh
    collapse rate, a share of the rows) of the shifted corpus against the reference's mean, with
    bootstrap intervals over documents (the module docstring); None for other probes."""
    if not is_shift(probe) or len(probe.levels) != 2:
        return None
    losses = probe.per_input.get("loss") or [None, None]
    rates = probe.prompt_collapse
    collapse = [None, None] if rates is None else [list(rates[0]), list(rates[1])]
    return {
        "documents": len(next((v for v in (*losses, *collapse) if v is not None), [])),
        "level": LEVEL,
        "loss": _against_reference(*losses),
        "collapse": _against_reference(*collapse),
        "association": _association(collapse[1], losses[1]),
    }


def _association(collapse: list | None, loss: list | None) -> dict[str, Any] | None:
    """Spearman's ρ over the shifted documents of fresh collapse against loss (the same documents,
    both finite), with its interval; None where either is missing or ρ is undefined."""
    if collapse is None or loss is None or len(collapse) != len(loss):
        return None
    pairs = [(c, v) for c, v in zip(collapse, loss) if _finite(c) and _finite(v)]
    rho, interval = spearman_ci([c for c, _ in pairs], [v for _, v in pairs])
    if rho is None:
        return None
    return {"measure": "spearman", "x": "collapse", "y": "loss", "documents": len(pairs), "rho": rho,
            "interval": None if interval is None else list(interval)}  # fmt: skip


def _finite(value: Any) -> bool:
    return value is not None and math.isfinite(value)


def _against_reference(reference: list | None, shifted: list | None) -> dict[str, Any] | None:
    """The shifted documents' values against the reference documents' mean, with its interval."""
    if reference is None or shifted is None:
        return None
    ref = np.array([v for v in reference if v is not None and math.isfinite(v)], dtype=float)
    new = np.array([v for v in shifted if v is not None and math.isfinite(v)], dtype=float)
    if not ref.size or not new.size:
        return None
    change = new - ref.mean()
    interval = bootstrap_difference_ci(ref, new)
    return {
        "reference": ref.tolist(), "shifted": new.tolist(),
        "reference_mean": float(ref.mean()), "shifted_mean": float(new.mean()),
        "change": change.tolist(), "mean_change": float(change.mean()),
        "interval": None if interval is None else list(interval),
        "quantiles": {q: float(np.quantile(change, p)) for q, p in (("min", 0), ("median", 0.5), ("max", 1))},
    }  # fmt: skip


def shift_lines(probe: ProbeResult) -> list[str]:
    """The shift probe's per-document lines for the terminal and HTML (none for other probes)."""
    summary = shift_summary(probe)
    if summary is None:
        return []
    lines = [f"{summary['documents']} documents per corpus, each the same number of tokens; "
             f"[ ]: {summary['level']:.0%} bootstrap intervals over documents"]  # fmt: skip
    loss, collapse = summary["loss"], summary["collapse"]
    if loss is not None:
        lines.append(
            f"output damage: loss {loss['reference_mean']:.2f} → {loss['shifted_mean']:.2f} nats/token, "
            f"{_change(loss, 1, '.2f')}; per document {_spread(loss, 1, '.2f')} (mixes the shifted "
            "text's own difficulty with damage)"
        )
    if collapse is not None:
        lines.append(
            f"saturation change: fresh collapse {collapse['reference_mean']:.1%} → "
            f"{collapse['shifted_mean']:.1%}, {_change(collapse, 100, '.1f')} points; per document "
            f"{_spread(collapse, 100, '.1f')}"
        )
    association = summary.get("association")
    if association is not None:
        lines.append(
            f"per document, saturation change against output damage: Spearman ρ {association['rho']:+.2f} "
            f"{_bracket(association['interval'])} over {association['documents']} documents (a correlation, "
            "not a cause: `ssacli attribute` patches)"
        )
    return lines


def _bracket(interval: list | None) -> str:
    return "(no interval)" if interval is None else f"[{interval[0]:+.2f}, {interval[1]:+.2f}]"


def shift_damage_text(probe: ProbeResult) -> str | None:
    """ "loss +2.55 [+2.23, +2.90] nats/token over the reference" (the shift probe's mean damage and
    its interval), or None where there is none (another probe, a model without an LM loss)."""
    summary = shift_summary(probe)
    loss = None if summary is None else summary["loss"]
    return None if loss is None else f"loss {_change(loss, 1, '.2f')} nats/token over the reference"


def _change(values: dict[str, Any], scale: float, spec: str) -> str:
    text = f"{scale * values['mean_change']:+{spec}}"
    if values["interval"] is not None:
        low, high = (scale * v for v in values["interval"])
        text += f" [{low:+{spec}}, {high:+{spec}}]"
    return text


def _spread(values: dict[str, Any], scale: float, spec: str) -> str:
    q = {k: scale * v for k, v in values["quantiles"].items()}
    return f"{q['min']:+{spec}} … {q['max']:+{spec}} (median {q['median']:+{spec}})"
