#!/usr/bin/env python3
"""The memory plan against the measured peaks, on random configurations, most of them Gemini's.

Draws configurations (depth, width, vocabulary, batch, sequence, chunk size, placement policy
(or none) and fractions, recomputation, activation offload, bf16/fp16, --grad-accum, --grad-clip,
Gemini's --copy-worker;
with --ranks 2 also the ZeRO stage and --shard-param-frac), runs `gpt2_train --steps 2` on a sim
device for each (under mpirun for --ranks > 1), and prints the plan printed before the run ("total: host H MiB |
sim:0 S MiB") against the peaks printed after it ("Host allocator: peak" plus the NVMe staging slots
outside the allocator, "sim:0: peak"), rank 0's.
A line starts OUT when either is more than 10% off (the plan's bar, docs/reliability.md section 6).

    /usr/bin/python3 tools/plan_sweep.py --runs 40 --seed 7            # one process
    /usr/bin/python3 tools/plan_sweep.py --runs 30 --seed 9 --ranks 2  # data parallel
    /usr/bin/python3 tools/plan_sweep.py --runs 30 --seed 5 --tiers    # three tiers

Peaks are printed in whole MiB: below 10 MiB a ratio says little.
"""
import argparse
import os
import random
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def draw(rng, ranks, tiers=False):
    heads = rng.choice([2, 4, 8])
    a = ["--model", "small", "--n-layer", str(rng.randint(1, 6)),
         "--n-embd", str(heads * rng.choice([16, 32, 64])), "--n-head", str(heads),
         "--vocab-size", str(rng.choice([100, 257, 1000, 5000, 50257])),
         "--batch", str(rng.choice([2, 4, 8])), "--seq", str(rng.choice([16, 32, 64, 128])),
         "--steps", "2", "--dropout", rng.choice(["0", "0.1"]), "--device", "sim:4GiB"]
    policy = rng.choice(["static", "static", "auto", "const", "none"])
    if policy != "none":  # none: the plain plan (parameters on the device, HybridAdam)
        a += ["--gemini", policy]
    if policy == "static":
        a += ["--offload-param-frac", rng.choice(["0", "0.3", "0.5", "1"]),
              "--offload-optim-frac", rng.choice(["0", "0.5", "1"])]
    if rng.random() < 0.5 and policy != "none":
        a += ["--chunk-size", str(rng.choice([20000, 50000, 100000, 300000, 1000000]))]
    r = rng.random()
    if r < 0.2:
        a += ["--checkpoint-activations"]
    elif r < 0.3:
        a += ["--checkpoint-segments", "0"]
    for flag, p in (("--offload-activations", 0.2),):
        if rng.random() < p:
            a.append(flag)
    if rng.random() < 0.2:
        a += ["--precision", rng.choice(["bf16", "fp16"])]
    if rng.random() < 0.15:
        a += ["--grad-accum", "2"]
    if rng.random() < 0.1:
        a += ["--grad-clip", "1"]
    if tiers and policy != "none":  # three tiers: what does not fit the host budget goes to disk
        a += ["--host-capacity", rng.choice(["16MiB", "48MiB", "96MiB", "192MiB"]),
              "--nvme-window", rng.choice(["1MiB", "4MiB"])]
    if ranks > 1:
        a += ["--zero", rng.choice(["2", "3"]), "--threads", "1"]
        if rng.random() < 0.3 and policy != "none":
            a += ["--shard-param-frac", rng.choice(["0.3", "0.5"])]
    if policy in ("auto", "const") and rng.random() < 0.5:  # chunks gathered ahead of their op
        a += ["--copy-worker", "on"]
    return a


def number(pattern, text):
    m = re.search(pattern, text)
    return float(m.group(1)) if m else None


def compare(text):
    rows = []
    for what, plan, peak in (("host", r"total: host ([0-9.]+)", r"Host allocator: peak ([0-9]+)"),
                             ("sim", r"\| sim:0 ([0-9.]+)", r"sim:0: peak ([0-9]+)")):
        p, m = number(plan, text), number(peak, text)
        if what == "host" and m is not None:  # the NVMe slots are host memory outside the allocator
            m += number(r"of it NVMe staging ([0-9]+)", text) or 0
        if p is not None and m is not None:
            rows.append((what, p, m, (p - m) / max(m, 1.0)))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--tiers", action="store_true",
                    help="add --host-capacity (three tiers; runs it refuses print EXIT)")
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "apps", "gpt2_train"))
    args = ap.parse_args()
    rng = random.Random(args.seed)
    launch = [] if args.ranks == 1 else ["mpirun", "--oversubscribe", "-np", str(args.ranks)]
    if args.ranks > 1 and os.geteuid() == 0:
        launch.insert(1, "--allow-run-as-root")
    out_of_bar = failed = 0  # failed: a crash, a hang, or a run whose peaks were not read
    for _ in range(args.runs):
        a = draw(rng, args.ranks, args.tiers)
        try:
            r = subprocess.run(launch + [args.binary] + a, capture_output=True, text=True,
                               errors="replace", timeout=600)
        except subprocess.TimeoutExpired:
            print("FAIL TIMEOUT", " ".join(a))
            failed += 1
            continue
        if r.returncode != 0:  # a refusal (--tiers draws budgets that cannot hold) or a crash
            crash = r.returncode not in (1, 2)
            failed += crash
            print("FAIL" if crash else "EXIT", r.returncode, " ".join(a), "|",
                  (r.stdout + r.stderr).strip().split("\n")[-1][:200])
            continue
        rows = compare(r.stdout + r.stderr)
        if not rows:
            print("FAIL no plan or peaks read |", " ".join(a[2:]), flush=True)
            failed += 1
            continue
        out = any(abs(e) > 0.10 and m >= 10 for _, _, m, e in rows)
        out_of_bar += out
        print("OUT " if out else "ok  ",
              " ".join(f"{w} {p:.1f}/{m:.0f} {100 * e:+.1f}%" for w, p, m, e in rows), "|",
              " ".join(a[2:]), flush=True)
    print(f"{args.runs} runs, {out_of_bar} outside the 10% bar (peaks of 10 MiB or more), "
          f"{failed} failed")
    return 1 if out_of_bar or failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
