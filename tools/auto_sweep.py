#!/usr/bin/env python3
"""Gemini auto where static cpu fits, and resumed runs against straight ones, on random configurations.

Two checks of promises the tests make on a few cases only, drawn over many (docs/reliability.md):

  auto    #10's "auto never fails where static with everything offloaded would fit": each
          configuration runs `--gemini static --offload-param-frac 1 --offload-optim-frac 1` on
          sim:4GiB, then `--gemini auto` (and, drawn, with `--copy-worker on`) on a sim device whose
          capacity is the larger of static's measured device peak (the JSON log's
          device_peak_bytes) and its plan; auto must train with static's losses.
  bitwise #10's "losses and weights equal the plain run bitwise": a drawn Gemini run (policy,
          fractions, budgets, chunk size, three tiers, copy worker) logs the plain run's losses
          and gradient norms to the last digit (the JSON log), with recomputation, activation
          offload, bf16/fp16, accumulation and clipping drawn for both.
  dp      #15's "losses match a single process on the same global batch": `mpirun -np 2` at a
          drawn ZeRO stage (plain or Gemini, --shard-param-frac drawn) against one plain process,
          fp32 at lr 1e-2, every loss within 1e-4 (tests/dist/dist_train.h: the summation order
          differs by ~1 ulp; a missed or doubled update moves a loss by 1e-3 or more). Refused
          combinations print EXIT.
  resume  a run checkpointed after step 2 and resumed from there logs the straight run's steps
          2-4 bit for bit (loss and gradient norm, every digit of the JSON log), under every
          placement (none, NVMe offload, Gemini static/auto/const, three tiers), with
          bf16/fp16, accumulation, clipping, recomputation and an lr schedule drawn.

    /usr/bin/python3 tools/auto_sweep.py auto --runs 50 --seed 2413
    /usr/bin/python3 tools/auto_sweep.py auto --runs 20 --seed 2451 --ranks 2   # --zero 2|3
    /usr/bin/python3 tools/auto_sweep.py bitwise --runs 40 --seed 2471
    /usr/bin/python3 tools/auto_sweep.py dp --runs 16 --seed 2491
    /usr/bin/python3 tools/auto_sweep.py resume --runs 40 --seed 2442

A line starts FAIL when the promise breaks or a run crashes (a signal, a sanitizer report: the
sweeps also run on the sanitizer build, --binary build-asan/apps/gpt2_train); configurations a run
refuses with a message (a host budget too small for them) print EXIT and count for nothing. The
exit status is 1 when anything failed.
"""
import argparse
import json
import os
import random
import re
import shutil
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mpirun(ranks):
    """The launcher prefix for `ranks` processes ([] for one)."""
    if ranks == 1:
        return []
    return (["mpirun", "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
            + ["-np", str(ranks)])


def draw_numerics(rng, p_precision, p_accum, p_clip):
    """bf16/fp16, --grad-accum 2 and --grad-clip 1, each drawn with its probability."""
    a = []
    if rng.random() < p_precision:
        a += ["--precision", rng.choice(["bf16", "fp16"])]
    if rng.random() < p_accum:
        a += ["--grad-accum", "2"]
    if rng.random() < p_clip:
        a += ["--grad-clip", "1"]
    return a


def draw_auto(rng, ranks):
    heads = rng.choice([2, 4, 8])
    a = ["--model", "small", "--n-layer", str(rng.randint(1, 6)),
         "--n-embd", str(heads * rng.choice([16, 32, 64])), "--n-head", str(heads),
         "--vocab-size", str(rng.choice([100, 257, 1000, 5000, 50257])),
         "--batch", str(rng.choice([2, 4, 8] if ranks > 1 else [1, 2, 4, 8])),
         "--seq", str(rng.choice([16, 32, 64, 128])), "--steps", "3",
         "--dropout", rng.choice(["0", "0.1"])]
    if ranks > 1:
        a += ["--threads", "1", "--zero", rng.choice(["2", "3"])]
    if rng.random() < 0.5:
        a += ["--chunk-size", str(rng.choice([20000, 50000, 100000, 300000, 1000000]))]
    r = rng.random()
    if r < 0.25:
        a += ["--checkpoint-activations"]
    elif r < 0.35:
        a += ["--checkpoint-segments", "0"]
    if rng.random() < 0.2:
        a.append("--offload-activations")
    a += draw_numerics(rng, 0.25, 0.15, 0.15)
    if rng.random() < 0.3:
        a += ["--host-capacity", rng.choice(["16MiB", "48MiB", "96MiB"]), "--nvme-window", "1MiB"]
    return a


def draw_gemini(rng):
    policy = rng.choice(["static", "auto", "const"])
    g = ["--gemini", policy]
    if policy == "static":
        g += ["--offload-param-frac", rng.choice(["0", "0.3", "1"]),
              "--offload-optim-frac", rng.choice(["0", "0.5", "1"])]
    if policy == "const":
        g += ["--const-budget", rng.choice(["256KiB", "1MiB", "4MiB"])]
    if policy != "static" and rng.random() < 0.4:
        g += ["--copy-worker", "on"]
    if rng.random() < 0.5:
        g += ["--chunk-size", str(rng.choice([20000, 50000, 300000]))]
    if rng.random() < 0.3:
        g += ["--host-capacity", rng.choice(["24MiB", "64MiB"]), "--nvme-window", "1MiB"]
    return g


def draw_training(rng):
    """A small model and its training options, for the bitwise and resume checks."""
    heads = rng.choice([2, 4])
    a = ["--model", "small", "--n-layer", str(rng.randint(1, 4)),
         "--n-embd", str(heads * rng.choice([16, 32])), "--n-head", str(heads),
         "--vocab-size", str(rng.choice([100, 257, 1000])), "--batch", str(rng.choice([2, 4])),
         "--seq", str(rng.choice([16, 32, 64])), "--steps", "5",
         "--dropout", rng.choice(["0", "0.1"]),
         "--lr-schedule", rng.choice(["constant", "cosine"]), "--warmup-steps", "1"]
    a += draw_numerics(rng, 0.3, 0.25, 0.25)
    r = rng.random()
    if r < 0.2:
        a += ["--checkpoint-activations"]
    elif r < 0.3:
        a += ["--offload-activations"]
    return a


def draw_resume(rng):
    a = draw_training(rng)
    placement = rng.choice(["none", "static", "auto", "const", "nvme"])
    if placement == "nvme":
        a += ["--offload", "nvme"]
    elif placement != "none":
        a += ["--device", "sim:4GiB", "--gemini", placement]
        if placement == "static":
            a += ["--offload-param-frac", rng.choice(["0", "0.5", "1"]),
                  "--offload-optim-frac", rng.choice(["0", "1"])]
        if placement == "const":
            a += ["--const-budget", "1MiB"]
        if rng.random() < 0.3:
            a += ["--host-capacity", "64MiB", "--nvme-window", "1MiB"]
    return a


def last_line(r):
    lines = (r.stderr or r.stdout).strip().splitlines()
    return lines[-1][:240] if lines else ""


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=900)


def crashed(r):
    """A refusal exits 1 or 2 with a message; a signal or a sanitizer report is a failure."""
    return r.returncode < 0 or "Sanitizer" in r.stderr or "runtime error:" in r.stderr


def refused(tag, r, what):
    """Prints a run that stopped; returns the failures it counts for (a crash: 1)."""
    bad = crashed(r)
    print("FAIL" if bad else tag, r.returncode, what, "|", last_line(r), flush=True)
    return 1 if bad else 0


def check_auto(launch, binary, a, rng, work):
    log = os.path.join(work, "static.jsonl")
    st = run(launch + [binary] + a + ["--device", "sim:4GiB", "--gemini", "static",
                                      "--offload-param-frac", "1", "--offload-optim-frac", "1",
                                      "--log", log])
    if st.returncode != 0:
        return refused("STATIC-EXIT", st, " ".join(a))
    peak = max(json.loads(l)["device_peak_bytes"]["sim:0"] for l in open(log) if l.strip())
    plan = re.search(r"total: host [0-9.]+ MiB \| sim:0 ([0-9.]+) MiB", st.stdout)
    planned = int((float(plan.group(1)) + 0.05) * (1 << 20)) if plan else 0  # printed to 0.1 MiB
    cap = (max(peak, planned) + 4095) // 4096 * 4096
    losses = re.findall(r"loss ([0-9.]+)", st.stdout)
    failures = 0
    for extra in [[]] + ([["--copy-worker", "on"]] if rng.random() < 0.4 else []):
        au = run(launch + [binary] + a + ["--device", f"sim:{cap}", "--gemini", "auto"] + extra)
        ok = au.returncode == 0 and re.findall(r"loss ([0-9.]+)", au.stdout) == losses
        failures += not ok
        print("ok  " if ok else "FAIL", f"sim:{cap}", " ".join(a + extra),
              "" if ok else "| " + last_line(au), flush=True)
    return failures


def check_bitwise(launch, binary, a, g, work):
    key = lambda r: (r["step"], r["loss"], r.get("grad_norm"))
    logs = []
    for extra, name in (([], "plain"), (g, "gemini")):
        log = os.path.join(work, name + ".jsonl")
        r = run(launch + [binary] + a + ["--device", "sim:4GiB", "--log", log] + extra)
        if r.returncode != 0 and name == "plain":
            return refused("EXIT", r, " ".join(a))
        if r.returncode != 0:
            print("FAIL", r.returncode, " ".join(a + extra), "|", last_line(r), flush=True)
            return 1
        logs.append([key(json.loads(l)) for l in open(log)])
    ok = logs[0] == logs[1]
    print("ok  " if ok else "FAIL", " ".join(a + g),
          "" if ok else f"| {logs[0]} vs {logs[1]}", flush=True)
    return 0 if ok else 1


def check_dp(binary, rng, work):
    a = [x for x in draw_training(rng) if x not in ("--precision", "bf16", "fp16")]
    a += ["--lr", "1e-2", "--threads", "1"]  # fp32: the summation order is the only difference
    zero = rng.choice(["1", "2", "3"])
    g = draw_gemini(rng) if rng.random() < 0.6 else []
    if g and rng.random() < 0.3:
        g += ["--shard-param-frac", rng.choice(["0.3", "0.5"])]
    if g:
        g = ["--device", "sim:4GiB"] + g
    one, two = os.path.join(work, "one.jsonl"), os.path.join(work, "two.jsonl")
    r1 = run([binary] + a + ["--log", one])
    r2 = run(mpirun(2) + [binary] + a + g + ["--zero", zero, "--log", two])
    what = " ".join(a + g + ["--zero", zero])
    if r1.returncode or r2.returncode:
        return refused("EXIT", r2 if r2.returncode else r1, what)
    la = [json.loads(l)["loss"] for l in open(one)]
    lb = [json.loads(l)["loss"] for l in open(two)]
    worst = max(abs(x - y) for x, y in zip(la, lb)) if len(la) == len(lb) else float("inf")
    ok = worst < 1e-4
    print("ok  " if ok else "FAIL", f"{worst:.2e}", what, flush=True)
    return 0 if ok else 1


def check_resume(launch, binary, a, work):
    key = lambda r: (r["step"], r["loss"], r.get("grad_norm"))
    straight, resumed = os.path.join(work, "a"), os.path.join(work, "b")
    r1 = run(launch + [binary] + a + ["--checkpoint-dir", straight, "--checkpoint-every", "2",
                                      "--log", straight + ".jsonl"])
    if r1.returncode != 0:
        return refused("RUN-EXIT", r1, " ".join(a))
    r2 = run(launch + [binary] + a + ["--checkpoint-dir", resumed, "--checkpoint-every", "2",
                                      "--resume", os.path.join(straight, "step_000002"),
                                      "--log", resumed + ".jsonl"])
    want = [key(json.loads(l)) for l in open(straight + ".jsonl")][2:]
    got = ([key(json.loads(l)) for l in open(resumed + ".jsonl")]
           if os.path.exists(resumed + ".jsonl") else [])
    ok = r2.returncode == 0 and got == want
    print("ok  " if ok else "FAIL", " ".join(a),
          "" if ok else f"| rc {r2.returncode} {last_line(r2)} | {want} vs {got}", flush=True)
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("check", choices=["auto", "bitwise", "dp", "resume"])
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--ranks", type=int, default=1, help="auto only: mpirun -np N")
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "apps", "gpt2_train"))
    args = ap.parse_args()
    rng = random.Random(args.seed)
    launch = mpirun(args.ranks)
    failures = 0
    for _ in range(args.runs):
        work = tempfile.mkdtemp(prefix="memwall-sweep-")
        try:
            if args.check == "auto":
                failures += check_auto(launch, args.binary, draw_auto(rng, args.ranks), rng, work)
            elif args.check == "dp":
                failures += check_dp(args.binary, rng, work)
            elif args.check == "bitwise":
                a = draw_training(rng)
                failures += check_bitwise(launch, args.binary, a, draw_gemini(rng), work)
            else:
                failures += check_resume(launch, args.binary, draw_resume(rng), work)
        except subprocess.TimeoutExpired:
            print("TIMEOUT", flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{args.runs} configurations, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
