#!/usr/bin/python3
"""PyTorch peer of memwall's GPT-2 training benchmark: step time and peak RSS for fp32 AdamW training.

    /usr/bin/python3 tools/torch_gpt2_bench.py --model small --batch 4 --seq 128 --steps 10 --threads 2 --json
    python3 tools/torch_gpt2_bench.py --device cuda --model small --batch 8 --seq 1024 --steps 10 --json

--device cuda runs the same steps on the GPU (fp32, TF32 off, as memwall's cuBLAS calls), times them with
torch.cuda.synchronize() before each clock read, and reports torch.cuda.max_memory_allocated as
"device_peak_mb" beside the RSS. --precision bf16 runs the forward and the loss under
torch.autocast(dtype=torch.bfloat16) (fp32 master weights and AdamW, as memwall's --precision bf16);
its GEMM ceiling is then measured in bf16.

Each step is exactly: zero_grad(set_to_none=True); logits = model(ids); loss = mean CE(logits[:, :-1],
ids[:, 1:]); loss.backward(); optimizer.step(). The model is tools/torch_gpt2.py's HF GPT-2 with dropout
0 in fp32; the optimizer is torch.optim.AdamW with its defaults (lr 1e-3, betas (0.9, 0.999), eps 1e-8,
weight_decay 0.01); the batch is one fixed set of random tokens in [0, vocab) (as ColossalAI's
get_data), reused every step. Each step is timed with time.perf_counter; the median of the steps after
the first is the headline (the first pays for page faults and allocator warm-up; gpt2_bench leaves
its own first step out the same way). Before and after the steps, the run
measures its ceiling: torch's fp32 GEMM rate on the MLP shape [B*T, C] @ [C, 4C] with the same threads, printed
next to the achieved 6*params*tokens rate (so a machine busy with other work shows in both).

Prints one line per step, then a summary; with --json, the last line of stdout is one JSON object:
  {"median_step_ms" (of the steps after the first), "step_ms": [...] (every step), "peak_rss_mb" (getrusage ru_maxrss / 1024), "losses": [...],
   "torch": version, "threads": N, plus the run's settings}

How the process is launched matters as much as the script (see docs/references.md and
tools/torch_gpt2_bench.sh, which runs it both "plain" and "tuned": OMP_WAIT_POLICY=PASSIVE and jemalloc
with decay off).
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt2 as tg  # noqa: E402


def sync(device):
    """Waits for the GPU's queued work (a no-op on the CPU), so a clock read sees it finished."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_gemm_gflops(n_embd, tokens, device, dtype=torch.float32, seconds=1.0):
    """The ceiling for this run: torch's GEMM rate in `dtype` on the MLP's shape [tokens, C] @ [C, 4C].

    Measured in the same process with the same threads (or GPU), so a busy machine lowers both numbers.
    """
    a = torch.randn(tokens, n_embd, device=device).to(dtype)
    b = torch.randn(n_embd, 4 * n_embd, device=device).to(dtype)
    torch.mm(a, b)  # warm-up: thread pool start, first-touch of the output
    sync(device)
    flop = 2.0 * tokens * n_embd * 4 * n_embd
    reps, t0 = 0, time.perf_counter()
    while True:
        torch.mm(a, b)
        reps += 1
        sync(device)
        dt = time.perf_counter() - t0
        if dt >= seconds:
            return flop * reps / dt / 1e9


def jemalloc_loaded():
    """True when jemalloc is mapped into this process (proves LD_PRELOAD took effect)."""
    try:
        with open("/proc/self/maps") as f:
            return "jemalloc" in f.read()
    except OSError:
        return False


def train_steps(model, optimizer, ids, steps, autocast_dtype=None):
    """Times `steps` AdamW training steps, the forward under autocast to `autocast_dtype` when given;
    returns the step times (ms) and the losses."""
    step_ms, losses = [], []
    for step in range(steps):
        sync(ids.device)
        t = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(ids.device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            logits = model(ids)
            loss = tg.lm_loss(logits, ids)
        loss.backward()
        optimizer.step()
        sync(ids.device)
        dt_ms = (time.perf_counter() - t) * 1e3
        del logits
        step_ms.append(dt_ms)
        losses.append(loss.item())
        print(f"[{step}] loss: {losses[-1]:.3f}  step {dt_ms:.0f} ms", flush=True)
    return step_ms, losses


def environment():
    """What the JSON summary records of the run's setting (threads, allocator, OpenMP)."""
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
        "ld_preload": os.environ.get("LD_PRELOAD", ""),
        "malloc_conf": os.environ.get("MALLOC_CONF", ""),
        "jemalloc_loaded": jemalloc_loaded(),
    }


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small", choices=sorted(tg.PRESETS))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="cpu | cuda[:N] (default cpu)")
    ap.add_argument("--attention", default="eager", choices=["eager", "sdpa"],
                    help="eager: HF's written-out attention (default); sdpa: torch's fused kernel")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                    help="bf16: forward and loss under torch.autocast(dtype=bfloat16)")
    ap.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    return ap.parse_args()


def select_device(args):
    """The torch.device to run on, with memwall's settings (no TF32, the chosen attention); None
    after printing why when that is impossible."""
    device = torch.device(args.device)
    tg.Attention.use_sdpa = args.attention == "sdpa"
    if tg.Attention.use_sdpa and not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        print(f"error: --attention sdpa needs torch >= 2.0 (this is {torch.__version__})", file=sys.stderr)
        return None
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # memwall's cuBLAS GEMMs are plain fp32
        torch.backends.cudnn.allow_tf32 = False
    return device


def main():
    args = parse_args()
    if args.steps < 1 or args.batch < 1 or args.seq < 2 or args.threads < 1:
        print("error: need --steps >= 1, --batch >= 1, --seq >= 2, --threads >= 1", file=sys.stderr)
        return 2

    cfg = tg.PRESETS[args.model].without_dropout()
    if args.seq > cfg.n_positions:
        print(f"error: --seq {args.seq} exceeds n_positions {cfg.n_positions}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = select_device(args)
    if device is None:
        return 2

    t0 = time.perf_counter()
    model = tg.GPT2LMHeadModel(cfg).to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), dtype=torch.int64).to(device)
    numel = model.numel()
    print(
        f"GPT-2 {args.model}: {numel:,} params ({numel / 1024**3:.3f} B), batch {args.batch}, "
        f"seq {args.seq}, threads {torch.get_num_threads()}, torch {torch.__version__}, "
        f"init {time.perf_counter() - t0:.1f} s, jemalloc {'yes' if jemalloc_loaded() else 'no'}",
        flush=True,
    )

    low = torch.bfloat16 if args.precision == "bf16" else None
    gemm_dtype = low or torch.float32
    gemm_before = measure_gemm_gflops(cfg.n_embd, args.batch * args.seq, device, gemm_dtype)
    step_ms, losses = train_steps(model, optimizer, ids, args.steps, low)
    gemm_after = measure_gemm_gflops(cfg.n_embd, args.batch * args.seq, device, gemm_dtype)
    gemm_gflops = 0.5 * (gemm_before + gemm_after)
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    median_ms = statistics.median(step_ms[1:] if len(step_ms) > 1 else step_ms)  # the first: warm-up
    # One step is ~6 * params * tokens FLOP (forward 2, backward 4), plus the LM head's share.
    tflop = 6.0 * numel * args.batch * args.seq / 1e12
    achieved_gflops = tflop / (median_ms / 1e3) * 1e3
    print(
        f"median step {median_ms:.0f} ms: {achieved_gflops:.1f} GFLOP/s at 6*N*tokens, against a GEMM "
        f"ceiling of {gemm_gflops:.1f} GFLOP/s measured in this run (before {gemm_before:.1f}, after "
        f"{gemm_after:.1f}; {tflop * 1e6 / gemm_gflops:.0f} ms/step at that rate); "
        f"peak RSS {peak_rss_mb:.0f} MB"
    )
    if args.json:
        summary = {
            "model": args.model,
            "params": numel,
            "batch": args.batch,
            "seq": args.seq,
            "steps": args.steps,
            "median_step_ms": median_ms,
            "step_ms": step_ms,
            "peak_rss_mb": peak_rss_mb,
            "achieved_gflops": achieved_gflops,
            "gemm_ceiling_gflops": gemm_gflops,
            "gemm_gflops_before": gemm_before,
            "gemm_gflops_after": gemm_after,
            "losses": losses,
            "device": str(device),
            "attention": args.attention,
            "precision": args.precision,
        }
        if device.type == "cuda":
            summary["device_peak_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
            summary["gpu"] = torch.cuda.get_device_name(device)
        print(json.dumps({**summary, **environment()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
