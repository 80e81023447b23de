"""Decode speed of a converted model against its softmax original, side by side in one run: greedy
``generate()`` with the KV cache, both loaded the way users load models (plain transformers, after
``import ssacli.transformers``). Not a test.

    python benchmarks/decode_speed.py [--models bundled,medium] [--batch 1,4] [--repeats 3]

Models: ``bundled`` is builtin:wikitext-softmax (the 0.8M-parameter Llama, 4 layers × 4 heads of 32,
128 positions); ``medium`` a random-init Llama built from its config (8 layers × 8 heads of 64,
hidden 512, vocabulary 1024, 1024 positions, init spread 0.2; random weights decode as fast as
trained ones). Each is converted with ``--scorer`` (ssacli.convert, written to a temporary folder).
Candidates: the original with transformers' default attention (SDPA) and with eager attention, and
the converted model (ssacli's attention: the fused SSA kernel where it may run). Each generates
``--new-tokens`` tokens after a prompt of each ``--prompt`` length that fits the model's positions,
batch by batch, timed in interleaved rounds
(benchmarks/_common.interleaved_best, best of ``--repeats``). "decode tok/s" counts the tokens after
the first: (time of N tokens - time of 1 token) / (N - 1) per sequence, so the prompt's prefill
is left out; "end-to-end tok/s" is N tokens over the whole call. The converted model's greedy
tokens are checked against ``ssacli.load_model``'s first (identical, or the script stops), and again
with the backend forced to ``fused`` (which refuses any call, a q_len = 1 decoding step included,
that would fall back to the eager weight matrix): the timed decoding runs on the fused kernel.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleaved_best  # noqa: E402

import ssacli  # noqa: E402
import ssacli.transformers  # noqa: E402, F401 (plain transformers loads the converted folder)

# initializer_range 0.2 (10x the default): attention logits far from zero, as a trained model's are;
# at the default the conversion meets its fidelity target and the folder is plain softmax by design
MEDIUM = dict(
    vocab_size=1024, hidden_size=512, intermediate_size=1376, num_hidden_layers=8, num_attention_heads=8,
    num_key_value_heads=8, max_position_embeddings=1024, initializer_range=0.2, bos_token_id=1,
    eos_token_id=2, pad_token_id=0,
)  # fmt: skip


def original_folder(name: str, root: Path) -> Path:
    """A save_pretrained folder of the softmax original."""
    if name == "bundled":
        from ssacli.models.references import resolve_model_path

        return resolve_model_path("builtin:wikitext-softmax")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    folder = root / name
    LlamaForCausalLM(LlamaConfig(**MEDIUM)).save_pretrained(folder)
    return folder


def candidates(original: Path, converted: Path) -> dict[str, torch.nn.Module]:
    from transformers import AutoModelForCausalLM

    def load(folder: Path, **kwargs) -> torch.nn.Module:
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kwargs).eval()

    return {
        "softmax (sdpa)": load(original),
        "softmax (eager)": load(original, attn_implementation="eager"),
        "converted (ssacli)": load(converted),
    }


def generate(model, prompt: torch.Tensor, tokens: int):
    def call():
        with torch.no_grad():
            return model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                                  pad_token_id=0)  # fmt: skip

    return call


def measure(name: str, spec: str, batches: list[int], prompts: list[int], new: int, repeats: int, root: Path):
    original = original_folder(name, root)
    converted = root / f"{name}-converted"
    ssacli.convert(str(original), spec, converted, dtype="float32", device="cpu")
    models = candidates(original, converted)
    config = models["converted (ssacli)"].config
    if config._attn_implementation != "ssacli":  # a conversion that met its target loads as softmax
        raise SystemExit(f"{name}: the conversion to {spec} met its fidelity target, so its folder is the "
                         "original with softmax; time a spec that moves the model")  # fmt: skip
    prompts = [p for p in prompts if p + new <= config.max_position_embeddings]
    print(f"\n{name}: {config.num_hidden_layers} layers × {config.num_attention_heads} heads, hidden "
          f"{config.hidden_size}; converted with {spec}; {new} new tokens, best of {repeats}")  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    ours = ssacli.load_model(str(converted), device="cpu", dtype="float32").model
    print("| prompt | batch | model | decode tok/s | end-to-end tok/s | ms/token | decode × softmax (sdpa) |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    for prompt_len, batch in [(p, b) for p in prompts for b in batches]:
        prompt = torch.randint(3, config.vocab_size, (batch, prompt_len), generator=generator)
        expected = generate(ours, prompt, new)()
        if not torch.equal(generate(models["converted (ssacli)"], prompt, new)(), expected):
            raise SystemExit("the plain transformers path generated other tokens than ssacli.load_model")
        # every call, the q_len = 1 decoding steps included, must take the fused kernel: the "fused"
        # backend raises where a call would fall back to the eager weight matrix
        with ssacli.attention_backend(models["converted (ssacli)"], "fused"):
            if not torch.equal(generate(models["converted (ssacli)"], prompt, new)(), expected):
                raise SystemExit("the fused kernel generated other tokens than the default backend")
        full = interleaved_best({k: generate(m, prompt, new) for k, m in models.items()}, repeats)
        first = interleaved_best({k: generate(m, prompt, 1) for k, m in models.items()}, repeats)
        base = None
        for key in models:
            per_token = max(full[key] - first[key], 1e-9) / (new - 1)
            rate = batch / per_token
            base = base or rate
            print(f"| {prompt_len} | {batch} | {key} | {rate:,.0f} | {batch * new / full[key]:,.0f} "
                  f"| {per_token * 1e3:.2f} | {rate / base:.2f} |")  # fmt: skip


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bundled,medium", help="bundled, medium (comma-separated)")
    parser.add_argument("--scorer", default="ssa:b=0.3,n=4", help="the spec the original is converted to")
    parser.add_argument("--batch", default="1,4", help="batch sizes (comma-separated)")
    parser.add_argument("--prompt", default="16,448", help="prompt lengths (each where it fits)")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens generated per sequence")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    from transformers import __version__ as transformers_version
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    load = os.getloadavg()
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores, "
          f"{torch.get_num_threads()} torch threads, load average {load[0]:.1f}; torch {torch.__version__}, "
          f"transformers {transformers_version}")  # fmt: skip
    batches = [int(b) for b in args.batch.split(",")]
    with tempfile.TemporaryDirectory() as root:
        for name in args.models.split(","):
            prompts = [int(p) for p in args.prompt.split(",")]
            measure(name, args.scorer, batches, prompts, args.new_tokens, args.repeats, Path(root))


if __name__ == "__main__":
    main()
