"""The Triton SSA kernels on a GPU (issue 40): parity first, then time against FlashAttention-2.
Not a test; scripts/gpu_bench.sh runs it in three time-limited steps (smoke, core, rest).

    python benchmarks/triton_ssa.py --device cuda --sections smoke     # versions, compile, parity (~30 s)
    python benchmarks/triton_ssa.py --device cuda --sections core      # the goal grid, causal
    python benchmarks/triton_ssa.py --device cuda --sections flex,finetune,non-causal,sweep --budget 170
    python benchmarks/triton_ssa.py --device cpu --quick               # every section, tiny, interpreted

Sections (--sections, comma-separated, run in the order given; each configuration's line is printed
as soon as it is timed, so a run cut by its time limit still reports what it finished):

* smoke: torch, CUDA, triton versions and the APIs used; the kernels compiled; ssa_attention(
  backend="triton") against a float64 reference on two shapes (bf16 GQA causal padded, T = 1,000; fp32
  MQA decoding 17 of 700 keys, per-layer b and n), output and the gradients of q, k, v, b, n.
* core / non-causal: B·T = 32,768 tokens, H = 16 at D = 128 and H = 32 at D = 64, T in {1k, 4k,
  16k}, bf16, causal (core) or not; forward and forward+backward (b and n learned); candidates
  ssa-triton, softmax-triton (the same kernels with the transform off: SSA's own cost), SDPA pinned
  to FlashAttention (sdpa_kernel(FLASH_ATTENTION)) and SDPA's default choice (cuDNN on sm90 with
  recent torch); then the goal ratios.
* flex: why backend="auto" no longer sends a learned n to flex_attention: forward+backward of flex
  with n learned (one atomic per score for n's gradient), with n fixed (the recipe's distillation),
  the blocked kernel and the Triton kernels, n learned, at B = 1, H = 16, T = 4,096, D = 128.
* finetune: one training step (forward, backward, AdamW) of a random-init model of SmolLM2-135M's
  configuration at T = 8,192, softmax (SDPA) against SSA (``ssa:preset=authors``: n learned per
  layer) through ssacli's attention with backend="auto".
* sweep: a few block sizes per Triton kernel (triton_ssa.GPU_CONFIGS) at T = 4,096, causal.

--device cpu sets TRITON_INTERPRET=1 before the kernels are imported: the Triton interpreter runs
them on CPU tensors (slowly: the sizes with --quick are tiny); FlashAttention and flex's backward do
not exist there and are reported as such. Times: median of --repeats after --warmup calls, each
between two device synchronizations, milliseconds.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time

import torch
from torch.nn import functional as F

GOALS = {  # (D, pass) -> (SSA-Triton / softmax-Triton, softmax-Triton / SDPA-FlashAttention)
    (128, "fwd"): (1.3, 1.2), (64, "fwd"): (1.6, 1.2),
    (128, "fwd+bwd"): (1.2, 1.2), (64, "fwd+bwd"): (1.4, 1.2),
}  # fmt: skip
TOKENS, FINETUNE_GOAL = 32768, 1.3
B_SSA, N_SSA = 0.8, 1.5
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}  # tests/kernels/test_triton_ssa.py's bounds
SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
               num_attention_heads=9, num_key_value_heads=3, rms_norm_eps=1e-5, rope_theta=100000.0,
               tie_word_embeddings=True)  # fmt: skip
TINY_LM = dict(SMOLLM2, vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2)  # fmt: skip


class Bench:
    def __init__(self, args):
        self.args, self.device, self.began = args, torch.device(args.device), time.monotonic()
        self.cuda = self.device.type == "cuda"
        self.rows: list[dict] = []

    def left(self) -> float:
        return self.args.budget - (time.monotonic() - self.began)

    def time_ms(self, fn) -> float:
        for _ in range(self.args.warmup):
            fn()
        times = []
        for _ in range(self.args.repeats):
            if self.cuda:
                torch.cuda.synchronize()
            began = time.perf_counter()
            fn()
            if self.cuda:  # the host waits for the device: no queue of earlier work is left to time
                torch.cuda.synchronize()
            times.append((time.perf_counter() - began) * 1e3)
        return statistics.median(times)

    def measure(self, fn) -> str | float:
        """fn's time in ms, or why it has none (out of memory, not on this device)."""
        try:
            return self.time_ms(fn)
        except Exception as err:  # noqa: BLE001 - a candidate that cannot run is reported, not fatal
            if self.cuda:
                torch.cuda.empty_cache()
            return f"n/a ({type(err).__name__}: {str(err).splitlines()[0][:80] if str(err) else ''})"


def fmt(value) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def ratio(a, b) -> float | None:
    return a / b if isinstance(a, float) and isinstance(b, float) else None


def attention_inputs(batch, heads, kv_heads, q_len, k_len, dim, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shapes = ((batch, heads, q_len, dim), (batch, kv_heads, k_len, dim), (batch, kv_heads, k_len, dim))
    return [torch.randn(*s, generator=gen).to(device, dtype).requires_grad_() for s in shapes]


def reference(q, k, v, b, n, causal, mask):
    """float64 SSA attention (softmax of n·sgn(y)·log1p|y|, y = b·q·kᵀ/√d), K/V repeated per group."""
    heads, q_len, k_len, group = q.shape[1], q.shape[2], k.shape[2], q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    b, n = (x.reshape(-1).expand(heads).reshape(1, -1, 1, 1) for x in (b, n))
    y = b * (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    t = n * torch.sign(y) * torch.log1p(y.abs())
    pos = torch.arange(q_len, device=q.device)[:, None] + k_len - q_len
    vis = torch.arange(k_len, device=q.device) <= pos if causal else torch.ones_like(t, dtype=torch.bool)
    vis = vis & mask if mask is not None else vis
    return torch.softmax(t.masked_fill(~vis, -math.inf), -1) @ v


def smoke(bench: Bench, ssa_attention) -> int:
    import triton

    from ssacli.kernels import triton_ssa

    cuda = torch.version.cuda if bench.cuda else None
    name = torch.cuda.get_device_name() if bench.cuda else platform.processor() or "cpu"
    print(f"torch {torch.__version__} (CUDA {cuda}), triton {triton.__version__}, device {name}, "
          f"interpreted: {triton_ssa.INTERPRETED}")  # fmt: skip
    apis = {
        "torch.library.custom_op": hasattr(torch.library, "custom_op"),
        "sdpa_kernel": hasattr(torch.nn.attention, "sdpa_kernel"),
        "tl.log2/exp2/reduce": all(hasattr(triton.language, f) for f in ("log2", "exp2", "reduce")),
    }
    print("APIs: " + ", ".join(f"{k} {'yes' if v else 'MISSING'}" for k, v in apis.items()))
    t, h = (48, 4) if bench.args.quick else (1000, 8)
    shapes = [  # (label, B, H, Hkv, Q, K, D, dtype, causal, padded, per-layer b and n)
        (f"bf16 GQA {h}/2 causal padded", 2, h, 2, t, t, 64, torch.bfloat16, True, True, False),
        (f"fp32 MQA {h}/1 decode, per-layer b n", 1, h, 1, 17, t - t // 4, 128, torch.float32, False, 0, 1),
    ]  # fmt: skip
    failed = 0
    for label, batch, heads, kv_heads, q_len, k_len, dim, dtype, causal, padded, layer in shapes:
        q, k, v = attention_inputs(batch, heads, kv_heads, q_len, k_len, dim, dtype, bench.device)
        b = torch.linspace(0.6, 1.2, 1 if layer else heads, device=bench.device).requires_grad_()
        n = torch.linspace(1.0, 2.0, 1 if layer else heads, device=bench.device).requires_grad_()
        mask = None
        if padded:  # the second sequence's last third of keys are padding
            mask = torch.ones(batch, 1, 1, k_len, dtype=torch.bool, device=bench.device)
            mask[1, ..., k_len - k_len // 3 :] = False
        began = time.perf_counter()
        out = ssa_attention(q, k, v, b, n, causal=causal, mask=mask, backend="triton")
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
        got = (out, *torch.autograd.grad(out, (q, k, v, b, n), g))
        seconds = time.perf_counter() - began
        leaves = [x.detach().double().requires_grad_() for x in (q, k, v, b, n)]
        ref = reference(*leaves, causal, mask)
        want = (ref, *torch.autograd.grad(ref, leaves, g.double()))
        errors = [((a.double() - w).norm() / w.norm()).item() for a, w in zip(got, want)]
        ok = max(errors) <= TOLERANCE[dtype]
        failed += not ok
        listed = ", ".join(f"{w} {e:.1e}" for w, e in zip(("out", "dq", "dk", "dv", "db", "dn"), errors))
        print(f"{'PASS' if ok else 'FAIL'} {label} (B={batch} Q={q_len} K={k_len} D={dim}; first call "
              f"{seconds:.1f} s): relative errors {listed} (bound {TOLERANCE[dtype]:g})")  # fmt: skip
    return failed


def candidates(q, k, v, b, n, causal, names, ssa_attention) -> dict:
    """name -> a call of that attention on these inputs (b and n learned where SSA uses them)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ssacli.kernels.triton_ssa import triton_ssa_attention

    ones = torch.ones_like(b).detach()

    def flash():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    calls = {
        "ssa-triton": lambda: triton_ssa_attention(q, k, v, b, n, causal=causal),
        "softmax-triton": lambda: triton_ssa_attention(q, k, v, ones, ones, causal=causal, ssa=False),
        "sdpa-flash": flash,
        "sdpa-default": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
        "blocked": lambda: ssa_attention(q, k, v, b, n, causal=causal, backend="torch-blocks"),
        "flex, n fixed": lambda: ssa_attention(q, k, v, b, n.detach(), causal=causal, backend="flex"),
        "flex, n learned": lambda: ssa_attention(q, k, v, b, n, causal=causal, backend="flex"),
    }
    return {name: calls[name] for name in names}


def timed(bench: Bench, call, kind: str, leaves) -> str | float:
    """ms of a forward (no grad) or a forward+backward (gradients of every leaf)."""
    if kind == "fwd":

        def run():
            with torch.no_grad():
                return call()
    else:
        grad = torch.randn_like(leaves[0])

        def run():
            for t in leaves:
                t.grad = None
            call().backward(grad)

    return bench.measure(run)


def learned(heads, device, value) -> torch.Tensor:
    return torch.full((heads,), value, device=device, requires_grad=True)


def grid(bench: Bench, causal: bool, ssa_attention) -> None:
    a = bench.args
    shapes = [(128, 16), (64, 32)] if not a.quick else [(64, 2), (32, 4)]
    lengths = [1024, 4096, 16384] if not a.quick else [40]
    tokens = TOKENS if not a.quick else 80
    dtype = torch.bfloat16 if bench.cuda else torch.float32
    names = ("ssa-triton", "softmax-triton", "sdpa-flash", "sdpa-default")
    print(f"\n## {'causal' if causal else 'non-causal'}: B·T = {tokens:,} tokens, {dtype}, ms (median of "
          f"{a.repeats}); then ssa/softmax-triton, softmax-triton/flash, ssa/sdpa-default")  # fmt: skip
    print("| D | H | B | T | pass | " + " | ".join(names) + " | ssa/sm | sm/flash | ssa/default |")
    print("|---:|---:|---:|---:|---|" + "---:|" * 7)
    for dim, heads in shapes:
        for length in lengths:
            batch = max(1, tokens // length)
            q, k, v = attention_inputs(batch, heads, heads, length, length, dim, dtype, bench.device)
            b, n = learned(heads, bench.device, B_SSA), learned(heads, bench.device, N_SSA)
            calls = candidates(q, k, v, b, n, causal, names, ssa_attention)
            for kind in ("fwd", "fwd+bwd"):
                head = f"| {dim} | {heads} | {batch} | {length} | {kind} | "
                if bench.left() < 0:
                    print(head + "not run: out of time |", flush=True)
                    continue
                times = {name: timed(bench, call, kind, (q, k, v, b, n)) for name, call in calls.items()}
                bench.rows.append(dict(dim=dim, kind=kind, causal=causal, **times))
                r = [ratio(times["ssa-triton"], times["softmax-triton"]),
                     ratio(times["softmax-triton"], times["sdpa-flash"]),
                     ratio(times["ssa-triton"], times["sdpa-default"])]  # fmt: skip
                shown = [fmt(times[c]) for c in names] + ["-" if x is None else f"{x:.2f}" for x in r]
                print(head + " | ".join(shown) + " |", flush=True)
    goals(bench, causal)


def goals(bench: Bench, causal: bool) -> None:
    rows = [r for r in bench.rows if r["causal"] == causal]
    print(f"\ngoals ({'causal' if causal else 'non-causal'}; met where every length meets it):")
    for (dim, kind), (own, quality) in GOALS.items():
        mine = [r for r in rows if r["dim"] == dim and r["kind"] == kind]
        pairs = (("ssa-triton", "softmax-triton", own), ("softmax-triton", "sdpa-flash", quality))
        for num, den, goal in pairs:
            values = [ratio(r[num], r[den]) for r in mine]
            if not values or None in values:
                print(f"  D={dim} {kind:8} {num} / {den}: not measured")
                continue
            verdict = ("MET" if max(values) <= goal else "MISSED") if bench.cuda else "no verdict off a GPU"
            shown = ", ".join(f"{x:.2f}x" for x in values)
            print(f"  D={dim} {kind:8} {num} / {den}: {shown} (goal <= {goal}x) -> {verdict}")
        default = ", ".join("-" if x is None else f"{x:.2f}x" for x in
                            (ratio(r["ssa-triton"], r["sdpa-default"]) for r in mine))  # fmt: skip
        print(f"  D={dim} {kind:8} ssa-triton / sdpa-default: {default} (reported)")


def flex(bench: Bench, ssa_attention) -> None:
    heads, length, dim = (16, 4096, 128) if not bench.args.quick else (2, 64, 32)
    dtype = torch.bfloat16 if bench.cuda else torch.float32
    q, k, v = attention_inputs(1, heads, heads, length, length, dim, dtype, bench.device)
    b, n = learned(heads, bench.device, B_SSA), learned(heads, bench.device, N_SSA)
    names = ("sdpa-flash", "ssa-triton", "blocked", "flex, n fixed", "flex, n learned")
    print(f"\n## flex: forward+backward, B=1 H={heads} T={length} D={dim} {dtype}, causal, b and n "
          "learned unless fixed, ms (the first line's time includes compiling)")  # fmt: skip
    base = None
    for name, call in candidates(q, k, v, b, n, True, names, ssa_attention).items():
        if bench.left() < 0:
            print(f"  {name}: not run: out of time", flush=True)
            continue
        began = time.perf_counter()
        ms = timed(bench, call, "fwd+bwd", (q, k, v, b, n))
        base = ms if name == "sdpa-flash" else base
        x = ratio(ms, base)
        print(f"  {name}: {fmt(ms)}{'' if x is None else f' ms ({x:.1f}x sdpa-flash)'} "
              f"[{time.perf_counter() - began:.0f} s in all]", flush=True)  # fmt: skip


def finetune(bench: Bench) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    import ssacli
    from ssacli.kernels import routing

    length = 8192 if not bench.args.quick else 32
    sizes = SMOLLM2 if not bench.args.quick else TINY_LM
    dtype = torch.bfloat16 if bench.cuda else torch.float32
    head_dim = sizes["hidden_size"] // sizes["num_attention_heads"]
    call = routing.Call(bench.device.type, dtype, training=True, n_grad=True,
                        head_dim=head_dim, triton=routing.triton_installed())  # fmt: skip
    print(f"\n## finetune: one AdamW step of a random-init SmolLM2-135M-config model "
          f"({sizes['num_hidden_layers']} layers), T={length}, {dtype}; SSA's attention: "
          f"backend='auto' -> {routing.choose_backend(call)}")  # fmt: skip
    ids = torch.randint(0, sizes["vocab_size"], (1, length), device=bench.device)
    times = {}
    for arm in ("softmax", "ssa:preset=authors"):
        if bench.left() < 0:
            print(f"  {arm}: not run: out of time", flush=True)
            continue
        torch.manual_seed(0)
        config = LlamaConfig(**sizes, max_position_embeddings=length, attn_implementation="sdpa")
        model = LlamaForCausalLM(config).to(bench.device, dtype).train()
        if arm != "softmax":
            ssacli.apply_scorer(model, arm)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

        def step(model=model, optimizer=optimizer):
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        times[arm] = bench.measure(step)
        print(f"  {arm}: {fmt(times[arm])} ms per step", flush=True)
        del model, optimizer
        if bench.cuda:
            torch.cuda.empty_cache()
    x = ratio(times.get("ssa:preset=authors"), times.get("softmax"))
    if x is not None:
        verdict = ("MET" if x <= FINETUNE_GOAL else "MISSED") if bench.cuda else "no verdict off a GPU"
        print(f"  ssa / softmax: {x:.2f}x (goal <= {FINETUNE_GOAL}x) -> {verdict}")


def sweep(bench: Bench, ssa_attention) -> None:
    from ssacli.kernels import triton_ssa

    if triton_ssa.INTERPRETED:
        print("\n## sweep: skipped (the interpreter does not use the GPU block sizes)")
        return
    alternatives = {"fwd": [(128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 3)],
                    "dkdv": [(32, 128, 4, 2), (64, 64, 4, 3), (64, 128, 8, 2)],
                    "dq": [(128, 32, 4, 2), (64, 64, 4, 3), (128, 64, 8, 2)]}  # fmt: skip
    print(
        "\n## sweep: (BLOCK_M, BLOCK_N, warps, stages) per kernel, T=4096 B=8 causal bf16, ms "
        "(fwd for the forward kernel, fwd+bwd for the backward ones)"
    )
    for dim, heads in ((128, 16), (64, 32)):
        q, k, v = attention_inputs(8, heads, heads, 4096, 4096, dim, torch.bfloat16, bench.device)
        b, n = learned(heads, bench.device, B_SSA), learned(heads, bench.device, N_SSA)
        call = candidates(q, k, v, b, n, True, ("ssa-triton",), ssa_attention)["ssa-triton"]
        for kind, configs in alternatives.items():
            pinned = triton_ssa.GPU_CONFIGS[(kind, dim)]
            for config in configs:
                if bench.left() < 0:
                    print(f"  D={dim} {kind} {config}: not run: out of time", flush=True)
                    continue
                triton_ssa.GPU_CONFIGS[(kind, dim)] = config
                ms = timed(bench, call, "fwd" if kind == "fwd" else "fwd+bwd", (q, k, v, b, n))
                print(
                    f"  D={dim} {kind} {config}{' (pinned)' if config == pinned else ''}: {fmt(ms)}",
                    flush=True,
                )
            triton_ssa.GPU_CONFIGS[(kind, dim)] = pinned


SECTIONS = ("smoke", "core", "flex", "finetune", "non-causal", "sweep")


def prepare_device(device: str) -> None:
    """Exit with one line where the device or triton is missing; on the CPU set TRITON_INTERPRET before
    any kernel is imported (triton.jit reads it when a kernel is defined)."""
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    elif not torch.cuda.is_available():
        sys.exit("no CUDA device: this benchmark is for a GPU (--device cpu: under the Triton interpreter)")
    try:
        import triton  # noqa: F401
    except ImportError:
        sys.exit("triton is not installed (pip install 'ssacli[gpu]')")


def arguments(doc: str, known: tuple[str, ...]) -> tuple[argparse.Namespace, list[str]]:
    """(the options, the sections asked) of a GPU benchmark's command line, the device prepared
    (prepare_device): --device, --sections (comma-separated, run in the order given), --quick,
    --repeats, --warmup, --budget."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sections", default=",".join(known), help=f"comma-separated, of {', '.join(known)}")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (the CPU dry run)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--budget", type=float, default=math.inf, help="seconds; later configurations are skipped"
    )
    args = parser.parse_args()
    sections = args.sections.split(",")
    if unknown := set(sections) - set(known):
        parser.error(f"unknown sections {sorted(unknown)}")
    prepare_device(args.device)
    return args, sections


def run_sections(sections: list[str], runners: dict) -> int:
    """Each section's runner in the order asked, its time printed after it; the failures counted (a
    runner returns how many of its checks failed, or None)."""
    failed = 0
    for section in sections:
        began = time.monotonic()
        failed += runners[section]() or 0
        print(f"[{section}: {time.monotonic() - began:.0f} s]", flush=True)
    print(f"\n{f'{failed} check(s) FAILED' if failed else 'done'}")
    return 1 if failed else 0


def main() -> int:
    args, sections = arguments(__doc__, SECTIONS)
    from ssacli.kernels.fused import ssa_attention

    bench = Bench(args)
    return run_sections(sections, {
        "smoke": lambda: smoke(bench, ssa_attention), "core": lambda: grid(bench, True, ssa_attention),
        "non-causal": lambda: grid(bench, False, ssa_attention), "flex": lambda: flex(bench, ssa_attention),
        "finetune": lambda: finetune(bench), "sweep": lambda: sweep(bench, ssa_attention),
    })  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
