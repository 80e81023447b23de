"""The header facts of an ``ssacli report`` about how AFTER (and CONTROL) were made and what AFTER
is now: its scorer with n per layer as it runs, its KL to BEFORE measured by the report, the
conversion's fidelity at its start, a recipe's outcome (:func:`conversion_facts`)."""

from __future__ import annotations

from typing import Any


def scorer_text(info: dict[str, Any]) -> str:
    """A side's scorer as it runs now: SSA with its n per layer (the final model's values, read from
    the loaded model), else the spec. The spec a converted folder keeps (``ssa:init=faithful,
    learn=b+n``) names where its conversion started, not the n it runs at."""
    n = (info.get("scorer_values") or {}).get("n")
    if not n:
        return str(info["scorer"])
    name = str(info["scorer"]).split(":")[0]
    return f"{name}, n per layer {per_layer_text(n)}"


def per_layer_text(values: list[float]) -> str:
    """4, 4, 4, 4; "4 in all 30 layers" when equal; mean (min–max) over many layers."""
    if len(set(values)) == 1 and len(values) > 1:
        return f"{values[0]:.3g} in all {len(values)} layers"
    if len(values) > 8:
        return f"{_mean(values):.3g} mean ({min(values):.3g}–{max(values):.3g}) over {len(values)} layers"
    return ", ".join(f"{v:.3g}" for v in values)


def conversion_facts(report: dict[str, Any]) -> list[tuple[str, str]]:
    """AFTER's conversion fidelity, the m chosen per layer by m=auto, and a warning when AFTER's
    fine-tuning ended with a held-out loss above its start; then a CONTROL's recipe record (what
    its training reached), each line named CONTROL."""
    after = (report.get("conversion") or {}).get("after") or {}
    fidelity = after.get("fidelity") or {}
    facts = []
    training = after.get("training") or {}
    if training.get("worsened"):
        best, kept = training.get("best"), ""
        if best:
            kept = f"; its best checkpoint (step {best['step']}, held-out {best['heldout_loss']:.4g}) is in "
            kept += best["path"]
        start, end = training["heldout_start"], training["heldout_end"]
        warning = f"AFTER's fine-tuning worsened its held-out loss ({start:.4g} → {end:.4g}){kept}"
        facts.append(("WARNING", warning))
    now = ((report.get("measurements") or {}).get("after") or {}).get("kl_to_before")
    if now:  # the final model's fidelity, measured by this report
        text = "built-in texts" if now["text"] == "lm_builtin" else "in-dist. text"
        facts.append(("AFTER now", f"KL to BEFORE {now['kl_per_token']:.3g} nats/token on "
                      f"{now['tokens']:,} tokens of the {text} (measured by this report)"))  # fmt: skip
    # ssacli.json's fidelity is the conversion's start; a fine-tune or recipe moved the model since
    key, start = "fidelity at conversion", ""
    if after.get("recipe"):
        key, start = "fidelity at start", " at conversion (faithful start)"
    elif training:
        key, start = "fidelity at start", " at conversion (before fine-tuning)"
    if "kl_per_token" in fidelity:
        facts.append((key, f"KL {fidelity['kl_per_token']:.3g} nats/token{start}, "
                      f"top-1 agreement {fidelity['top1_agreement']:.2%}"))  # fmt: skip
    elif "relative_error" in fidelity:
        facts.append((key, f"relative error {fidelity['relative_error']:.3g}{start}"))
    facts += recipe_facts(after.get("recipe"))
    layers = fidelity.get("layers") or []
    if layers:
        ms = ", ".join(f"{row['m']:g}" for row in layers)
        facts.append(("m per layer (m=auto)", f"{ms}: larger m = SSA's polynomial regime starts later "
                      "(closer to softmax)"))  # fmt: skip
    control = (report.get("conversion") or {}).get("control") or {}
    for key, text in recipe_facts(control.get("recipe")):
        if key == "WARNING":
            facts.append((key, f"CONTROL: {text}"))
        else:
            facts.append((f"CONTROL {key.removeprefix('recipe ')}", text))
    return facts


def recipe_facts(recipe: dict[str, Any] | None) -> list[tuple[str, str]]:
    """A recipe conversion's outcome: the final n against its target, held-out quality against the
    original's (and the --max-loss criterion), the KL as fidelity; a missed criterion or target is a
    WARNING. A softmax control says it is one. Records written before --max-loss judged the KL."""
    if not recipe or not recipe.get("final"):
        return []
    final, config = recipe["final"], recipe.get("config") or {}
    seconds = recipe.get("seconds", {}).get("total", "?")
    if recipe.get("control"):
        facts = [("recipe", f"softmax control: the distill stage's budget spent without SSA; {seconds} s")]
    else:
        stages = " → ".join(config.get("stages") or [])
        target = config.get("target_n")
        target = (
            "faithful m"
            if target is None
            else f"{target:g}" + (", then learned" if config.get("learn_n") else "")
        )
        facts = [("recipe", f"{stages}; n target {target}, reached max n "
                  f"{final['n_max']:g}; {seconds} s")]  # fmt: skip
    if final.get("kl") is not None:
        tokens = (recipe.get("heldout") or {}).get("tokens")
        quality = f"held-out ppl {final['heldout_ppl']:.4g} vs the original's {final['original_ppl']:.4g} "
        quality += f"(×{final['ppl_ratio']:.3f})" + (f" on {tokens:,} tokens" if tokens else "")
        if "met_max_loss" in final:
            met = final["met_max_loss"]
            text = f"{quality}; loss {final['loss_change']:+.3g} nats/token "
            text += f"(--max-loss {config.get('max_loss'):g}"
            text += (
                f": {'met' if met else 'MISSED'}); KL to the original {final['kl']:.3g} nats/token (fidelity)"
            )
        else:  # a record of the KL budget's time
            met = final["met_max_kl"]
            text = f"held-out KL {final['kl']:.3g} nats/token (budget {config.get('max_kl'):g}"
            text += f": {'met' if met else 'MISSED'}); {quality}"
        facts.append(("recipe result" if met else "WARNING", text))
    if not recipe.get("control") and final.get("at_target_n") is False:
        facts.append(("WARNING", f"the recipe stopped before n reached {config.get('target_n'):g}"))
    if recipe.get("snapshot"):
        facts.append(("stage", f"this folder is the recipe's {recipe['snapshot']} snapshot"))
    return facts


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


__all__ = ["conversion_facts", "per_layer_text", "recipe_facts", "scorer_text"]
