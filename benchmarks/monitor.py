"""What the saturation monitor (ssacli.SaturationCallback, --monitor-every) costs next to a training
step, in one run. Not part of the test suite; read the ratios, not the seconds.

    python benchmarks/monitor.py [--rounds 10] [--every 100]

For each model, in interleaved rounds (one of each per round, best of --rounds after one warm-up):

* step: one AdamW training step of a causal LM (forward, backward, update) on a batch of
  --batch × --seq tokens, in train mode with the model's own attention (SDPA);
* measure: one ``SaturationMonitor().measure(model)`` with its defaults (key-scale:1,8 on 4 × 64
  tokens of the built-in texts: two observed forwards, no backward).

The cost per step at interval N is measure / (N × step). The step here is the bare loop's; a
``Trainer`` step also logs, schedules and moves data, so its step is longer and the share smaller.

Models: the bundled ``builtin:wikitext-softmax`` (Llama, 4 layers × 4 heads × 128, 1,024 tokens of
vocabulary) and the tiny Llama of tests/train/test_monitor.py (2 layers × 4 heads, width 32).
"""

from __future__ import annotations

import argparse

import torch
from _common import interleaved_best
from transformers import LlamaConfig, LlamaForCausalLM

import ssacli
from ssacli.train.monitor import DEFAULT_EVERY, SaturationMonitor


def models():
    bundled = ssacli.load_model("builtin:wikitext-softmax", device="cpu")
    tokenizer = bundled.tokenizer
    yield "builtin:wikitext-softmax", bundled.model, tokenizer
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    yield "tiny llama (tests)", LlamaForCausalLM(config), tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--every", type=int, default=DEFAULT_EVERY)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args()
    print(f"torch threads {torch.get_num_threads()}; training batch {args.batch} × {args.seq} tokens; "
          f"interval {args.every} steps; best of {args.rounds} rounds")  # fmt: skip
    print(f"{'model':26} {'step s':>8} {'measure s':>10} {'measure/step':>13} {'cost/step at N':>15}")
    for name, model, tokenizer in models():
        ratio, best = measure_ratio(model, tokenizer, args)
        print(f"{name:26} {best['step']:8.4f} {best['measure']:10.4f} {ratio:13.2f} "
              f"{ratio / args.every:14.2%}")  # fmt: skip


def measure_ratio(model, tokenizer, args) -> tuple[float, dict[str, float]]:
    """(measure ÷ step, the best seconds of each), timed in interleaved rounds."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (args.batch, args.seq), generator=generator)
    monitor = SaturationMonitor()

    def step() -> None:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    best = interleaved_best({"step": step, "measure": lambda: monitor.measure(model, tokenizer)}, args.rounds)
    return best["measure"] / best["step"], best


if __name__ == "__main__":
    main()
