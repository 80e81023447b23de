"""A new user's natural mistakes are refused before the model stack, in a second (issue 54, item 2).

Each case runs the real entry point (``python -m ssacli …``) in a fresh interpreter on input that is
wrong in a way the command line and the files' headers show: a folder with only config.json, a .txt
file given as the model, a truncated safetensors file, pickle-only weights without --allow-pickle,
training data that is not there, a --control folder that holds no control, an option out of
range, a result file that is no result, a requirement that does not parse, a toml that does not,
flags of the recipe or of fine-tuning where they do not apply, a device that is not there, models
of the wrong kind. Each must end with its documented exit code and one line naming the problem and
the fix, with neither torch nor transformers ever imported (the interpreter reports its modules at
exit: tests/helpers/entry.py), in under a second of CPU (and a generous wall bound: this suite
shares its cores). The table of every case (modules imported, CPU and wall time) is printed at the end of the
run (``pytest -rA`` or ``-s`` shows it; ``SSACLI_REFUSAL_TABLE=FILE`` also writes it there).

``--device cuda`` is known without torch only where the machine tells (ssacli.models.devices: a
CPU-only torch build, or Linux without a GPU device node); elsewhere torch alone is imported to ask,
never transformers, and the case says so.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from ssacli.errors import EXIT_CHECK_USAGE, EXIT_INPUT, EXIT_UNSUPPORTED, EXIT_USAGE
from ssacli.models.builtins import BUILTIN_DIR, META_FILE
from ssacli.models.devices import cuda_known_absent
from ssacli.models.kinds import ModelKind, different_kinds
from tests.helpers.entry import INPUT_LIMIT_S, run_entry

# Wall time: generous, the CPU bound is the real one. Run at nice 19 beside CPU-bound jobs (load 5.6
# on 2 cores), a refusal of 0.4 s of CPU took 26 s of wall time; on an idle machine, 0.3 s.
WALL_LIMIT_S = 60.0
LLAMA = "builtin:wikitext-softmax"
ICL = "builtin:every-softmax"
RECIPE = ["convert", LLAMA, "--scorer", "ssa", "--out", "o", "--finetune", "--data", "notes.txt"]
CUDA_KNOWN = cuda_known_absent()

CONVERT = ["convert", ICL, "--scorer", "ssa", "--out", "o"]
REPORT = ["report", LLAMA, "builtin:wikitext-ssa"]
GATE = ["check", "-r", "collapse_rate@key-scale:8 <= 1"]
PLACED = ["diagnose", "--device-map", "auto", "--max-memory"]
ICL_TRAIN = ["icl", "train", "--task", "every", "--out"]
CHECK = EXIT_CHECK_USAGE  # `ssacli check`'s own code for a usage or input error (docs/ci.md)

# case: (argv, exit code, what the one line says)
CASES = {
    "a folder with only config.json": (["diagnose", "cfgonly"], EXIT_INPUT, "has no weights"),
    "a .txt file given as the model": (["diagnose", "notes.txt"], EXIT_INPUT, "is a file; give"),
    "a folder without config.json": (["diagnose", "empty"], EXIT_INPUT, "has no config.json"),
    "config.json that is not JSON": (["diagnose", "badconfig"], EXIT_INPUT, "cannot read the config"),
    "a truncated .safetensors": (["diagnose", "truncated"], EXIT_INPUT, "corrupt or truncated"),
    "--tau 1.5": (["diagnose", "--tau", "1.5"], EXIT_USAGE, "tau must be in (0, 1]"),
    "--samples 0": (["diagnose", "--samples", "0"], EXIT_USAGE, "'--samples'"),
    "--heatmap of no metric": (["diagnose", "--heatmap", "heat"], EXIT_USAGE, "unknown metric 'heat'"),
    "--device tpu": (["diagnose", "--device", "tpu"], EXIT_USAGE, "unknown device 'tpu'"),
    "--dtype float8": (["diagnose", "--dtype", "float8"], EXIT_USAGE, "unknown dtype 'float8'"),
    "--device cuda:99": (["diagnose", "--device", "cuda:99"], EXIT_USAGE, "--device cuda:99"),
    "--text for the bundled ICL model": (["diagnose", "--text", "notes.txt"], EXIT_USAGE,
                                         "--text has no effect on 'builtin:every-softmax'"),
    "render out.html (no such result)": (["render", "out.html"], EXIT_INPUT, "does not exist"),
    "render a report JSON": (["render", "report.json"], EXIT_INPUT, "is an `ssacli report` JSON"),
    "check: a threshold that is no number": (
        ["check", "-r", "collapse_rate@key-scale:8 <= abc"], CHECK, "'abc' is not a number"
    ),
    "check: an unknown metric": (["check", "-r", "heat@key-scale:8 <= 1"], CHECK, "unknown metric"),
    "check: a toml that does not parse": (["check", "--config", "bad.toml"], CHECK, "bad.toml"),
    "convert --finetune without --data": ([*CONVERT, "--finetune"], EXIT_USAGE, "--data is required"),
    "convert: the recipe with --steps 200": ([*RECIPE, "--steps", "200"], EXIT_USAGE, "--steps applies"),
    "convert: a fine-tune flag alone": ([*CONVERT, "--steps", "5"], EXIT_USAGE, "only applies with"),
    "convert: a recipe flag with --stages lm": (
        [*RECIPE, "--stages", "lm", "--transfer-steps", "5"], EXIT_USAGE, "applies to the conversion recipe"
    ),
    "convert: --control without a folder": ([*RECIPE, "--control"], EXIT_USAGE, "'--control'"),
    "convert: --control a file": ([*RECIPE, "--control", "notes.txt"], EXIT_USAGE, "is a file; give a"),
    "report of a Llama against a BERT": (["report", LLAMA, "bert"], EXIT_INPUT, "AFTER 'bert' a masked"),
    "report of a Llama against a bare BertModel": (
        ["report", LLAMA, "bertmodel"], EXIT_INPUT, "AFTER 'bertmodel' an encoder"
    ),
    "pickle-only weights without --allow-pickle": (["diagnose", "pickle"], EXIT_INPUT, "only pickle weights"),
    "train --data that does not exist": (["train", "--data", "nope.txt", "--out", "o"], EXIT_INPUT, "not"),
    "train --data icl:every (a language model)": (
        ["train", "--data", "icl:every", "--out", "o"], EXIT_USAGE, "is for ICL models"
    ),
    "finetune of a folder that does not exist": (["finetune", "./nope", "--data", "notes.txt"], EXIT_INPUT,
                                                  "'./nope' does not exist"),
    "convert: --control a folder that holds no control": (
        [*RECIPE, "--control", "notcontrol"], EXIT_USAGE, "holds no softmax control"
    ),
    "icl eval of a language model": (["icl", "eval", LLAMA], EXIT_INPUT, "needs an ICL model"),
    "--device-map sideways": (["diagnose", "--device-map", "sideways"], EXIT_USAGE, "unknown --device-map"),
    "--max-memory without --device-map": (
        ["diagnose", "--max-memory", "cpu=1GB"], EXIT_USAGE, "give --device-map auto with it"
    ),
    "check: a baseline that does not exist": ([*GATE, "--baseline", "missing.json"], CHECK, "does not exist"),
    "check: --max-regression -1": ([*GATE, "--max-regression", "-1"], CHECK, "finite number >= 0"),
    "diagnose --compare a result not there": (
        ["diagnose", "--compare", "missing.json"], EXIT_INPUT, "'missing.json' does not exist"
    ),
    "train --arch nope": (["train", "--arch", "nope", "--data", "notes.txt", "--out", "o"], EXIT_USAGE,
                          "unknown --arch 'nope'"),
    "report --sigma -1": ([*REPORT, "--sigma", "-1"], EXIT_USAGE, "--sigma takes positive numbers"),
    "report --outlier bogus": ([*REPORT, "--outlier", "bogus"], EXIT_USAGE, "bad outlier 'bogus'"),
    "report --text-id not there": ([*REPORT, "--text-id", "missing.txt"], EXIT_INPUT, "does not exist"),
    "report --pairs not there": ([*REPORT, "--pairs", "missing.jsonl"], EXIT_INPUT, "does not exist"),
    "icl train --task nope": (["icl", "train", "--task", "nope", "--out", "o"], EXIT_USAGE, "unknown task"),
    "icl eval --outlier bogus": (["icl", "eval", ICL, "--outlier", "bogus"], EXIT_USAGE, "bad outlier"),
    "finetune --data icl:nope": (["finetune", ICL, "--out", "o", "--data", "icl:nope"], EXIT_USAGE,
                                 "unknown task 'nope'"),
    "attribute --heads L99H0 (no such layer)": (
        ["attribute", LLAMA, "--heads", "L1H0,L99H0"], EXIT_USAGE,
        f"head L99H0 is not in '{LLAMA}': its config.json declares 4 layers of 4 heads, L0H0 to L3H3",
    ),
    "attribute --heads L0H9 (no such head)": (["attribute", "llama", "--heads", "L0H9"], EXIT_USAGE,
                                              "head L0H9 is not in 'llama'"),
    "attribute --k above the model's heads": (["attribute", LLAMA, "--k", "17"], EXIT_USAGE,
                                              "k must be at most the model's 16 heads, got 17"),
    "attribute of an ICL model": (["attribute", ICL], EXIT_UNSUPPORTED, "causal LMs only, not icl models"),
    "attribute of a BERT": (["attribute", "bert"], EXIT_UNSUPPORTED, "causal LMs only, not masked models"),
    "attribute under length with --random": (
        ["attribute", LLAMA, "--probe", "length:1,2", "--random"], EXIT_USAGE, "'length' needs text"
    ),
    "check --device-map sideways": ([*GATE, "--device-map", "sideways"], CHECK, "unknown --device-map"),
    "check: --max-memory without --device-map": (
        [*GATE, "--max-memory", "cpu=1GB"], CHECK, "give --device-map auto with it"
    ),
    "check: a toml's device that is none": (["check", "--config", "tpu.toml"], CHECK, "unknown device 'tpu'"),
    "check: a toml's model that is not there": (
        ["check", "--config", "nope.toml"], CHECK, "model path './nope' does not exist"
    ),
    "check: a toml's scorer that is none": (["check", "--config", "scorer.toml"], CHECK, "unknown scorer"),
    "check: a toml's max_memory that is no DEVICE=SIZE": (
        ["check", "--config", "memory.toml"], CHECK, "--max-memory takes DEVICE=SIZE"
    ),
    "--max-memory 0:abc": ([*PLACED, "0:abc"], EXIT_USAGE, "--max-memory takes DEVICE=SIZE"),
    "--max-memory of one device twice": ([*PLACED, "cpu=1GB,cpu=2GB"], EXIT_USAGE, "gives cpu twice"),
    "--max-memory of a device that is none": ([*PLACED, "tpu=1GB"], EXIT_USAGE, "unknown device 'tpu'"),
    "--max-memory cpu=0": ([*PLACED, "cpu=0"], EXIT_USAGE, "the size must be more than 0 bytes"),
    "--max-memory of a GPU under --device-map cpu": (
        ["diagnose", "--device-map", "cpu", "--max-memory", "0=1GB"], EXIT_USAGE, "--device-map cpu uses none"
    ),
    "finetune a language model on an ICL task": (
        ["finetune", LLAMA, "--out", "o", "--data", "icl:every"], EXIT_USAGE,
        "--data icl:every is for ssacli's ICL models; give text for a causal model",
    ),
    "finetune an ICL model on text": (["finetune", ICL, "--out", "o", "--data", "notes.txt"], EXIT_USAGE,
                                      "ICL models train on synthetic prompts: --data icl:every"),
    "convert --finetune of a language model on an ICL task": (
        [*CONVERT[:1], LLAMA, *CONVERT[2:], "--finetune", "--data", "icl:every"], EXIT_USAGE,
        "is for ssacli's ICL models"
    ),
    "convert: the recipe for a BERT": (
        ["convert", "bert", "--scorer", "ssa", "--out", "o", "--finetune", "--data", "notes.txt"], EXIT_USAGE,
        "the conversion recipe distils causal LMs; 'bert' is a masked model",
    ),
    "icl eval --sigma abc": (["icl", "eval", ICL, "--sigma", "abc"], EXIT_USAGE, "--sigma takes comma"),
    "icl train --preset nope": ([*ICL_TRAIN, "o", "--preset", "nope"], EXIT_USAGE, "unknown preset 'nope'"),
    "icl train --arch nope": ([*ICL_TRAIN, "o", "--arch", "nope"], EXIT_USAGE, "unknown ICL arch 'nope'"),
    "icl train into a checkpoint": ([*ICL_TRAIN, "icl"], EXIT_USAGE, "holds a checkpoint; pass --resume"),
    "icl train into a folder of someone else's": ([*ICL_TRAIN, "bert"], EXIT_USAGE,
                                                  "--out bert holds files ssacli did not write"),
    "train without --arch": (["train", "--data", "notes.txt", "--out", "o"], EXIT_USAGE,
                             "--arch is needed with --size tiny"),
    "train --size nope": (["train", "--arch", "gpt2", "--data", "notes.txt", "--out", "o", "--size", "nope"],
                          EXIT_USAGE, "--size 'nope' is neither tiny nor small nor a config.json file"),
    "train into a folder that exists": (["train", "--arch", "gpt2", "--data", "notes.txt", "--out", "bert"],
                                        EXIT_USAGE, "--out bert already exists (pass --resume"),
    "report of ICL models on a text": ([*REPORT[:1], ICL, "builtin:every-ssa", "--text-id", "notes.txt"],
                                       EXIT_USAGE, "--text-id/--text-ood needs causal or masked language"),
    "report --reuse-before not there": ([*REPORT, "--reuse-before", "missing.json"], EXIT_USAGE,
                                        "--reuse-before missing.json: not a readable JSON report"),
    **({"--max-memory of a GPU where there is none": (
        [*PLACED, "0=1GB"], EXIT_USAGE, "0 CUDA device(s) visible; give only cpu=SIZE"
    )} if CUDA_KNOWN else {}),
}  # fmt: skip
TORCH_ALONE = set() if CUDA_KNOWN else {"--device cuda:99"}  # torch alone tells here, not transformers


def _model_folders(root: Path) -> None:
    """The files the cases name, built from the bundled models and a few bytes: nothing is trained."""
    llama = BUILTIN_DIR / "wikitext-softmax"
    (root / "cfgonly").mkdir()
    shutil.copy(llama / "config.json", root / "cfgonly")
    (root / "notes.txt").write_text("Some text of mine.\n")
    (root / "empty").mkdir()
    (root / "badconfig").mkdir()
    (root / "badconfig" / "config.json").write_text("{model_type: llama")
    shutil.copytree(llama, root / "truncated")
    weights = root / "truncated" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    bert = root / "bert"
    bert.mkdir()
    config = {"model_type": "bert", "architectures": ["BertForMaskedLM"], "hidden_size": 8}
    (bert / "config.json").write_text(json.dumps(config))
    tensors = {"bert.embeddings.word_embeddings.weight": np.zeros((4, 8), np.float32)}
    save_file(tensors, bert / "model.safetensors")  # a header to read; no weight is ever loaded
    bare = root / "bertmodel"  # BertModel: no LM head; its family (bert) says encoder
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({**config, "architectures": ["BertModel"]}))
    shutil.copy(bert / "model.safetensors", bare)
    pickle = root / "pickle"  # pytorch_model.bin only: refused by name, never unpickled
    shutil.copytree(llama, pickle, ignore=shutil.ignore_patterns("*.safetensors"))
    (pickle / "pytorch_model.bin").write_bytes(b"never read")
    (root / "notcontrol").mkdir()  # an ssacli model folder, but no softmax control's
    shutil.copy(BUILTIN_DIR / "wikitext-ssa" / META_FILE, root / "notcontrol")
    (root / "report.json").write_text(json.dumps({"schema": "ssacli-report", "schema_version": 1}))
    (root / "bad.toml").write_text("[check\nrequires = [")
    gate = '[check]\nrequires = ["collapse_rate@key-scale:8 <= 1"]\n'
    for name, line in {"tpu": 'device = "tpu"', "nope": 'model = "./nope"', "scorer": 'scorer = "nosuch"',
                       "memory": 'device_map = "auto"\nmax_memory = "0:abc"'}.items():  # fmt: skip
        (root / f"{name}.toml").write_text(gate + line + "\n")
    shutil.copytree(llama, root / "llama")  # a local folder of the bundled Llama's (4 layers of 4 heads)
    shutil.copytree(BUILTIN_DIR / "every-softmax", root / "icl")  # an ICL checkpoint


@pytest.fixture(scope="module")
def table(request):
    rows: list[tuple[str, int, int, float, float, str]] = []
    yield rows
    lines = [f"{'case':46} {'exit':>4} {'modules':>7} {'CPU s':>6} {'wall s':>6}  model stack"]
    for case, code, modules, cpu, wall, stack in rows:
        lines.append(f"{case:46} {code:>4} {modules:>7} {cpu:>6.2f} {wall:>6.2f}  {stack}")
    text = "\n".join(lines) + f"\n(load average at the end: {os.getloadavg()[0]:.2f})\n"
    if os.environ.get("SSACLI_REFUSAL_TABLE"):
        Path(os.environ["SSACLI_REFUSAL_TABLE"]).write_text(text)
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("-", "issue 54: natural mistakes, refused before the model stack")
        reporter.write_line(text)


@pytest.mark.parametrize(("args", "code", "words"), CASES.values(), ids=CASES.keys())
def test_a_natural_mistake_is_refused_in_one_line_before_torch(args, code, words, tmp_path, table, request):
    case = request.node.callspec.id
    _model_folders(tmp_path)
    done, output, stack, modules, cpu, wall = run_entry(args, tmp_path)
    table.append((case, done.returncode, modules, cpu, wall, ",".join(stack) or "none"))
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == code, done.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], done.stderr
    assert "Traceback" not in done.stderr and output == ""
    assert stack == (["torch"] if case in TORCH_ALONE else []), stack
    assert cpu < INPUT_LIMIT_S or case in TORCH_ALONE, f"{cpu:.2f} s of CPU ({wall:.2f} s of wall time)"
    assert wall < WALL_LIMIT_S, f"{wall:.2f} s of wall time"


def test_a_kind_is_named_with_its_article():
    """The issue's "a encoder one": every kind reads right in the one message that names two."""
    kinds = (ModelKind.CAUSAL, ModelKind.ENCODER)
    line = str(different_kinds(("BEFORE", "AFTER"), ("llama", "bert"), kinds))
    assert "is a causal model and AFTER 'bert' an encoder one" in line, line
    read = [kind.with_article for kind in ModelKind]
    assert read == ["an icl", "a causal", "a masked", "an encoder", "a seq2seq"]
