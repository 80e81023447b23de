"""What each side of an ``ssacli report`` is: :func:`describe` (model, family, kind, scorer and its
values per layer as the model runs now) and :func:`conversion_record` (what its ssacli.json says
about how it was made)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..models.kinds import ModelKind
from ..models.loading import LoadedModel


def conversion_record(loaded: LoadedModel) -> dict[str, Any]:
    """What ssacli.json says about how a folder was made: its conversion fidelity (with the m chosen
    per layer) and, for fine-tuned folders, the training trajectory (one record per evaluation:
    loss, held-out loss, KL to the source model, b and n per layer). Empty for other models."""
    from ..models.checkpoint import read_meta

    meta = read_meta(loaded.path) if loaded.path is not None and loaded.kind != ModelKind.ICL else None
    if not meta:
        return {}
    training = meta.get("training") or {}
    record = {"source": meta.get("source"), "fidelity": meta.get("fidelity")}
    recipe = meta.get("recipe")
    if recipe:  # a recipe conversion (ssacli.train.recipe): its stages are the trajectory
        from ..train.recipe import recipe_trajectory

        record["trajectory"] = recipe_trajectory(recipe)
        record["recipe"] = {k: recipe.get(k) for k in ("config", "final", "seconds", "snapshot", "heldout")}
        if recipe.get("control"):  # a softmax control (recipe_facts says so); an SSA arm's record as it was
            record["recipe"]["control"] = True
    if training:
        record["trajectory"] = training.get("trajectory") or []
        keys = ("step", "steps", "seconds", "tokens", "tokens_per_s")
        keys += ("heldout_start", "heldout_end", "worsened")  # worsened: held-out loss ended above its start
        record["training"] = {k: training.get(k) for k in keys}
        record["training"]["config"] = training.get("config")
        if training.get("monitor"):  # --monitor-every: saturation measured during the run
            record["monitor"] = training["monitor"]
        best = training.get("best")
        if best:  # where the run kept its best evaluated checkpoint (a fine-tune that worsened)
            record["training"]["best"] = {**best, "path": str(Path(loaded.path) / best["folder"])}
    return record


def describe(loaded: LoadedModel, result) -> dict[str, Any]:
    """A side's model, family, kind and scorer spec, and where its scorer has parameters their
    values per layer as the model runs now (``scorer_values``: e.g. SSA's n, the final model's,
    which the spec, written at conversion, does not say)."""
    from ..models.optim import scorer_values

    described = {"model": loaded.name, "weights": loaded.weights, "family": loaded.family,
                 "kind": loaded.kind, "scorer": result.scorer}  # fmt: skip
    values = scorer_values(loaded.attention_root) if loaded.kind != ModelKind.ICL else {}
    per_layer = {k: v for k, v in values.items() if not k.endswith("_heads")}
    if per_layer:
        described["scorer_values"] = per_layer
    return described


__all__ = ["conversion_record", "describe"]
