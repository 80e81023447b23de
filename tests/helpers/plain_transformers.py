"""Folders loaded the ways a user of plain transformers loads them, in a fresh interpreter.

    python tests/helpers/plain_transformers.py OUT [--register|--register-after] [--explicit] DIR ...

For each DIR: ``AutoConfig``, ``AutoModelForCausalLM``, the concrete class config.json's
``architectures`` names (``LlamaForCausalLM``, ``GPT2LMHeadModel``) and ``pipeline("text-generation")``,
each ``from_pretrained(DIR)`` with no other argument; with ``--explicit``, for a guarded DIR, also
:data:`EXPLICIT`: the same with an explicit ``attn_implementation`` (what transformers'
refusal of "ssacli" suggests), whose outcome also holds ``warned``, what transformers logged at
warning level. Without ``--register`` ssacli is never imported (checked at the end); with it,
``import ssacli`` comes first, before torch and transformers (its hook registers when transformers
is imported); ``--register-after`` imports transformers first.
OUT/result.json says per folder and way: ``{"refused": message}``, ``{"config":
attn_implementation}`` or ``{"logits": file, "dtype": …}`` with the model's logits (no cache) on
:data:`IDS`, saved in OUT. The test side (:func:`plain_loads`) runs it and reads the result back.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WAYS = ("AutoConfig", "AutoModelForCausalLM", "concrete", "pipeline")
EXPLICIT = ("AutoModelForCausalLM:sdpa", "AutoModelForCausalLM:eager", "AutoModel:sdpa", "pipeline:sdpa",
            "concrete:sdpa")  # fmt: skip
# What a way's refusal of a guarded folder without ssacli says (issue 51): the concrete class refuses the
# attention implementation, every Auto class and pipeline the model type, which says `import ssacli`
REFUSALS = {"concrete": 'attn_implementation="ssacli"'}
NEEDS = "import ssacli"
IDS = [[1, 5, 9, 33, 2, 7, 100, 12, 40, 3], [3, 3, 8, 60, 21, 9, 1, 4, 77, 15]]  # < every test vocab


def plain_loads(
    folders: list[Path], out: Path, register: bool | str, explicit: bool = False
) -> dict[str, dict[str, dict]]:
    """Run this script on ``folders`` in a fresh interpreter; {folder: {way: outcome}}, where an
    outcome with logits holds them as a tensor under "tensor". ``register``: False, True (``import
    ssacli`` first) or "after" (``import transformers``, then ``import ssacli``); ``explicit``: also
    the :data:`EXPLICIT` ways, for guarded folders."""
    from safetensors.torch import load_file

    flag = {False: [], True: ["--register"], "after": ["--register-after"]}[register]
    args = [sys.executable, str(Path(__file__)), str(out), *flag, *(["--explicit"] if explicit else [])]
    done = subprocess.run([*args, *map(str, folders)], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads((out / "result.json").read_text())
    assert result.pop("ssacli imported") is bool(register)
    for outcomes in result.values():
        for outcome in outcomes.values():
            if "logits" in outcome:
                outcome["tensor"] = load_file(out / outcome["logits"])["logits"]
    return result


def refuses_naming_ssacli(way: str, outcome: dict) -> bool:
    """Whether ``outcome`` (of ``way``, without ssacli) is the refusal a guarded folder gets."""
    return REFUSALS.get(way.partition(":")[0], NEEDS) in outcome.get("refused", "")


def _load(way: str, folder: str):
    import transformers

    way, _, attention = way.partition(":")
    kwargs = {"attn_implementation": attention} if attention else {}
    if way == "AutoConfig":
        return transformers.AutoConfig.from_pretrained(folder)
    if way.startswith("AutoModel"):
        return getattr(transformers, way).from_pretrained(folder, **kwargs)
    if way == "concrete":
        name = json.loads((Path(folder) / "config.json").read_text())["architectures"][0]
        return getattr(transformers, name).from_pretrained(folder, **kwargs)
    return transformers.pipeline("text-generation", model=folder, model_kwargs=kwargs).model


class _Warnings(logging.Handler):
    """What transformers logs at warning level while a load runs (its verbosity is error otherwise)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(" ".join(record.getMessage().split()))


def main(out: Path, register: bool | str, folders: list[str], explicit: bool = False) -> None:
    if register is True:
        import ssacli  # noqa: F401 (the one line: it registers ssacli's attention once transformers loads)

        assert "torch" not in sys.modules and "transformers" not in sys.modules
    import torch
    import transformers

    if register == "after":
        import ssacli  # noqa: F401, F811 (transformers is imported: it registers at once)
    from safetensors.torch import save_file

    transformers.logging.set_verbosity_error()
    result = {}
    for index, folder in enumerate(folders):
        outcomes = result[folder] = {}
        guarded = "attn_implementation" in json.loads((Path(folder) / "config.json").read_text())
        ways = WAYS + EXPLICIT if guarded and explicit else WAYS
        for number, way in enumerate(ways):
            warned = _Warnings()
            if ":" in way:
                transformers.logging.set_verbosity_warning()
                transformers.logging.get_logger().addHandler(warned)
            try:
                loaded = _load(way, folder)
            except Exception as err:  # noqa: BLE001 (what it raised is the outcome)
                outcomes[way] = {"refused": f"{type(err).__name__}: {' '.join(str(err).split())}"}
                continue
            finally:
                transformers.logging.get_logger().removeHandler(warned)
                transformers.logging.set_verbosity_error()
            if way == "AutoConfig":
                outcomes[way] = {"config": loaded._attn_implementation}
                continue
            with torch.no_grad():
                output = loaded(torch.tensor(IDS), use_cache=False)
                logits = getattr(output, "logits", None)  # AutoModel: the hidden states
                logits = (output.last_hidden_state if logits is None else logits).contiguous()
            name = f"{index}-{number}.safetensors"
            save_file({"logits": logits}, out / name)
            outcomes[way] = {"logits": name, "dtype": str(logits.dtype).removeprefix("torch."),
                             "class": type(loaded).__name__, "scorers": _scorers(loaded),
                             "warned": warned.lines}  # fmt: skip
    result["ssacli imported"] = "ssacli" in sys.modules
    (out / "result.json").write_text(json.dumps(result, indent=1))


def _scorers(model) -> list[str]:
    """The spec of every attention module's attached scorer (ssacli's submodule), as a plain
    module walk: nothing of ssacli is imported for it."""
    return sorted({m.ssacli_scorer.spec for m in model.modules() if hasattr(m, "ssacli_scorer")})


if __name__ == "__main__":
    arguments = sys.argv[1:]
    register = "after" if "--register-after" in arguments else "--register" in arguments
    explicit = "--explicit" in arguments
    arguments = [a for a in arguments if a not in ("--register", "--register-after", "--explicit")]
    main(Path(arguments[0]), register, arguments[1:], explicit)
