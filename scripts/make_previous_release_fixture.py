"""Write fixtures/previous-release/: checkpoint folders made by the PREVIOUS release of ssacli, and
the outputs that release computes from them, so tests/models/test_checkpoint.py can check that the current
code still loads them and computes the same.

Run it with the previous release first on the path (a git worktree of that commit), e.g.

    git worktree add /work/old 6db3e50
    PYTHONPATH=/work/old .venv/bin/python scripts/make_previous_release_fixture.py

It writes, from a fresh temporary folder:

* ``converted-llama-ssa/``: ``ssacli convert llama --scorer ssa --finetune …`` of a tiny random
  llama (built here from a config, with a byte-level BPE tokenizer trained on ssacli's probe texts),
  fine-tuned 4 steps on ``corpus.txt`` so SSA's learned b and n are not at their initial values;
* ``icl-every-ssa/``: ``ssacli icl train --task every --scorer ssa …``, 4 steps of a 1-layer model;
* ``corpus.txt``: the fine-tuning data (the run records ``--data corpus.txt``, relative);
* ``expected_outputs.safetensors``: fixed inputs and what the previous release's ``load_model``
  computes from each folder (llama logits, ICL predictions);
* ``README.md``: the commit and the exact commands.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[1]
CONVERT = [
    "convert", "llama", "--scorer", "ssa", "--out", "converted-llama-ssa", "--finetune",
    "--data", "corpus.txt", "--steps", "4", "--lr", "0.01", "--batch-size", "2", "--seq-len", "16",
    "--checkpoint-every", "2", "--device", "cpu", "--quiet",
]  # fmt: skip
ICL_TRAIN = [
    "icl", "train", "--task", "every", "--scorer", "ssa", "--steps", "4", "--batch-size", "4",
    "--lr", "0.01", "--layers", "1", "--heads", "2", "--width", "8", "--points-start", "3",
    "--points-end", "5", "--checkpoint-every", "2", "--device", "cpu", "--out", "icl-every-ssa",
]  # fmt: skip
LLAMA = dict(
    hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=1, max_position_embeddings=32, tie_word_embeddings=True,
    pad_token_id=0, bos_token_id=1, eos_token_id=2,
)  # fmt: skip
VOCAB = 288  # byte-level BPE needs at least 261 entries


def source_commit(package_dir: Path) -> str:
    result = subprocess.run(
        ["git", "-C", str(package_dir), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    )
    dirty = subprocess.run(
        ["git", "-C", str(package_dir), "status", "--porcelain", "--", "ssacli"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    return result.stdout.strip() + (" (with uncommitted changes)" if dirty else "")


def build_llama(folder: Path) -> None:
    from ssacli.probe_texts import TEXTS  # the previous release's module names
    from ssacli.scratch import train_tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM

    tokenizer = train_tokenizer(list(TEXTS), VOCAB, max_length=LLAMA["max_position_embeddings"])
    config = AutoConfig.for_model("llama", vocab_size=len(tokenizer), **LLAMA)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    (folder.parent / "corpus.txt").write_text("\n\n".join(TEXTS) + "\n")


def run_cli(args: list[str], cwd: Path) -> None:
    subprocess.run([sys.executable, "-m", "ssacli", *args], cwd=cwd, check=True)


@torch.inference_mode()
def expected_outputs(out: Path) -> dict[str, torch.Tensor]:
    import ssacli
    from ssacli.models.icl_task import sample_batch

    llama = ssacli.load_model(str(out / "converted-llama-ssa"), device="cpu")
    vocab = llama.config.vocab_size
    ids = torch.randint(3, vocab, (2, 12), generator=torch.Generator().manual_seed(0))
    logits = llama.model(input_ids=ids, use_cache=False).logits
    icl = ssacli.load_model(str(out / "icl-every-ssa"), device="cpu")
    tokens = sample_batch("every", 3, 5, generator=torch.Generator().manual_seed(0)).tokens
    predictions = icl.model(tokens)
    return {
        "converted.input_ids": ids,
        "converted.logits": logits.float().contiguous(),
        "icl.tokens": tokens.contiguous(),
        "icl.predictions": predictions.float().contiguous(),
    }


README = """\
# Checkpoints written by the previous release

Made by `scripts/make_previous_release_fixture.py` with ssacli {version} at commit {commit}
(`PYTHONPATH=<a worktree of that commit> python scripts/make_previous_release_fixture.py`),
torch {torch}, transformers {transformers}. tests/models/test_checkpoint.py loads every folder with the
current code and checks that it computes `expected_outputs.safetensors` (what that release computed
from the same folders) and reads the same ssacli.json. Do not regenerate these with a newer ssacli:
they stand for what users already have on disk.

In a fresh temporary folder, the script built `llama/` (a random 2-layer llama, width 16, with a
byte-level BPE tokenizer of {vocab} entries trained on ssacli's probe texts, also written as
`corpus.txt`) and then ran:

    python -m ssacli {convert}
    python -m ssacli {icl_train}

* `converted-llama-ssa/`: the "ssacli-model" format (save_pretrained folder, ssacli.json with the
  fidelity and training records, ssacli_scorer.safetensors with SSA's fine-tuned b and n,
  trainer.safetensors with the AdamW state at step 4);
* `icl-every-ssa/`: the "ssacli-icl" format (config.json, model.safetensors, ssacli.json,
  trainer.safetensors with the Adam state and the data generator at step 4);
* `expected_outputs.safetensors`: `converted.input_ids` -> `converted.logits` (llama logits) and
  `icl.tokens` -> `icl.predictions`, computed by that release's `ssacli.load_model(FOLDER)`.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "fixtures" / "previous-release")
    args = parser.parse_args()
    import transformers

    import ssacli

    package_dir = Path(ssacli.__file__).resolve().parents[1]
    commit = source_commit(package_dir)
    print(f"ssacli {ssacli.__version__} from {package_dir} at {commit}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        build_llama(work / "llama")
        run_cli(CONVERT, work)
        run_cli(ICL_TRAIN, work)
        if args.out.exists():
            shutil.rmtree(args.out)
        args.out.mkdir(parents=True)
        for name in ("converted-llama-ssa", "icl-every-ssa"):
            shutil.copytree(work / name, args.out / name)
        shutil.copy(work / "corpus.txt", args.out / "corpus.txt")
    metadata = {"ssacli_commit": commit, "ssacli_version": ssacli.__version__}
    save_file(expected_outputs(args.out), args.out / "expected_outputs.safetensors", metadata=metadata)
    (args.out / "README.md").write_text(
        README.format(
            version=ssacli.__version__,
            commit=commit,
            torch=torch.__version__,
            transformers=transformers.__version__,
            vocab=VOCAB,
            convert=" ".join(CONVERT),
            icl_train=" ".join(ICL_TRAIN),
        )  # fmt: skip
    )
    total = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"wrote {args.out} ({total / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
