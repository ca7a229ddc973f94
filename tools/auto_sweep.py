#!/usr/bin/env python3
"""Promises of Gemini, data parallel, resumption and failing disks, on random configurations.

Ten checks of promises the tests make on a few cases only, drawn over many (docs/reliability.md):

  auto    #10's "auto never fails where static with everything offloaded would fit": each
          configuration runs `--gemini static --offload-param-frac 1 --offload-optim-frac 1` on
          sim:4GiB, then `--gemini auto` (and, drawn, with `--copy-worker on`) on a sim device whose
          capacity is the larger of static's measured device peak (the JSON log's
          device_peak_bytes) and its plan; auto must train with static's losses.
  signal  "never lose a saved model": SIGTERM or SIGKILL after a drawn step of a run that
          checkpoints every 3 steps (--keep 1 or 2 drawn), under every placement. SIGTERM: exit
          143 naming the checkpoint of the step under way, nothing left in --nvme-dir or
          TMPDIR. Either way the newest checkpoint resumes to the straight run's losses bit for
          bit, and the resume's own saves remove what a killed run left half-written. With
          --ranks N, rank 1 alone gets SIGTERM: every rank must write that step's checkpoint and
          stop.
  const   #10's "--const-budget caps gathered-chunk memory": on auto's drawn configurations, the
          const policy's device peak (the JSON log's) is at most static cpu placement's plus the
          budget (256 KiB to 16 MiB, the copy worker drawn), with static's losses.
  bitwise #10's "losses and weights equal the plain run bitwise": a drawn Gemini run (policy,
          fractions, budgets, chunk size, three tiers, copy worker) logs the plain run's losses
          and gradient norms to the last digit (the JSON log), samples the same tokens from the
          trained model, evaluates the same validation loss (--val-data) and saves the same
          bytes (--save's model.safetensors); the plain run's saved model, loaded into the
          Gemini placement (`--eval-only --init-from`), evaluates to the same loss, and
          gpt2_generate on it draws the run's last sample; with recomputation, activation
          offload, bf16/fp16, accumulation and clipping drawn for both; a three-tier run leaves
          its --nvme-dir empty.
  dp      #15's "losses match a single process on the same global batch": `mpirun -np 2` (or
          --ranks N, the batch a multiple of N) at a drawn ZeRO stage (plain or Gemini,
          --shard-param-frac drawn) against one plain process, fp32 at lr 1e-2, every loss
          within 1e-4 (tests/dist/dist_train.h: the summation order differs by ~1 ulp; a
          missed or doubled update moves a loss by 1e-3 or more). Refused combinations print
          EXIT.
  dpbitwise Gemini under data parallel: at 2 ranks, a drawn ZeRO stage (0, 2, 3, sharded
          parameters drawn) and one chunk size, a drawn policy (fractions, budgets, copy worker,
          three tiers) trains bit for bit as static cpu placement (losses, norms, saved bytes).
  finetune a user's fine-tune: a model trained and saved, then `--init-from` it on 1-3 shards
          of tokens (--data, --shuffle drawn), plain and in a drawn Gemini placement (three
          tiers drawn: the loader streams each tensor into its chunk): the same losses, norms
          and saved bytes, bit for bit (one process).
  ranks   #15's "checkpoints written at N ranks load at M ranks": a 2-rank run (a drawn ZeRO
          stage, plain or Gemini) checkpointed after step 2 and resumed at 1 or 4 ranks logs the
          2-rank run's steps 2-4 within the dp check's 1e-4.
  resume  a run checkpointed after step 2 and resumed from there logs the straight run's steps
          2-4 bit for bit (loss and gradient norm, every digit of the JSON log), under every
          placement (none, NVMe offload, Gemini static/auto/const, three tiers), with
          bf16/fp16, accumulation, clipping, recomputation and an lr schedule drawn; half the
          resumed runs draw another placement (the checkpoint's optimizer layout is mapped onto
          it), and a resume must not warn that the run changed; half the runs read their tokens
          from 1-3 shards (--data, --shuffle drawn), crossing shards and epochs, and half
          evaluate every 2 steps or sample every 3 (the evaluations and samples after the
          checkpoint must be the straight run's too).
  fault   "a full disk ... loses nothing": a run (in RAM, NVMe offload, or three tiers on small
          chunks) whose Nth I/O request fails (MW_IO_FAULT, the states' and chunks' reads and
          writes) or whose Nth file write fails (MW_WRITE_FAULT: ENOSPC, EIO, or a short write,
          which must be retried) exits 1 with a message, or ends as the clean run (losses and
          saved weights bit for bit) where it recovers or N lies beyond its last request; it
          leaves no file in --nvme-dir or TMPDIR and no partial --save, and its latest
          checkpoint resumes to the clean run's losses bit for bit. With --ranks N one rank's
          disk fails (rank 0's file writes, rank 1's I/O requests), and every rank must stop.

    /usr/bin/python3 tools/auto_sweep.py auto --runs 50 --seed 2413
    /usr/bin/python3 tools/auto_sweep.py auto --runs 20 --seed 2451 --ranks 2   # --zero 2|3
    /usr/bin/python3 tools/auto_sweep.py bitwise --runs 40 --seed 2471
    /usr/bin/python3 tools/auto_sweep.py dp --runs 16 --seed 2491
    /usr/bin/python3 tools/auto_sweep.py resume --runs 40 --seed 2442
    /usr/bin/python3 tools/auto_sweep.py fault --runs 60 --seed 2513
    /usr/bin/python3 tools/auto_sweep.py const --runs 30 --seed 2551
    /usr/bin/python3 tools/auto_sweep.py signal --runs 40 --seed 2571
    /usr/bin/python3 tools/auto_sweep.py ranks --runs 50 --seed 2582
    /usr/bin/python3 tools/auto_sweep.py finetune --runs 60 --seed 2622
    /usr/bin/python3 tools/auto_sweep.py dpbitwise --runs 40 --seed 2652

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
import signal
import struct
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mpirun(ranks):
    """The launcher prefix for `ranks` processes ([] for one). LeakSanitizer is off for the ranks
    (Open MPI leaves ~120 KB from MPI_Init that no suppression can match: tests/dist/mpi_launch.h);
    ASan's other checks stay on."""
    if ranks == 1:
        return []
    return (["mpirun", "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
            + ["-x", "ASAN_OPTIONS=detect_leaks=0", "-np", str(ranks)])


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


def write_shard(path, ids):
    """llm.c's token shard: a 256-int32 header (magic, version, count), then uint16 ids."""
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(ids), *[0] * 253))
        f.write(struct.pack(f"<{len(ids)}H", *ids))


def write_data(rng, a, work):
    """1-3 shards of a few steps' tokens each in work/data; returns the directory."""
    rows = int(a[a.index("--batch") + 1]) * int(a[a.index("--seq") + 1])
    data = os.path.join(work, "data")
    os.makedirs(data)
    for k in range(rng.randint(1, 3)):
        ids = [rng.randrange(100) for _ in range(rng.randint(rows + 1, 4 * rows))]
        write_shard(os.path.join(data, f"train_{k:03d}.bin"), ids)
    return data


def draw_data(rng, a, work):
    """Half the time: training tokens from 1-3 shards of a directory (a few steps' worth each, so
    that a run crosses shards and epochs), read in order or --shuffle'd."""
    if rng.random() < 0.5:
        return []
    return ["--data", write_data(rng, a, work)] + (["--shuffle"] if rng.random() < 0.5 else [])


def draw_between(rng, work):
    """Half the time each: evaluation every 2 steps (--val-data) and a sample every 3 steps, the
    work a run does between steps, which must leave a resumed run as the straight one."""
    a = []
    if rng.random() < 0.5:
        val = os.path.join(work, "val.bin")
        write_shard(val, [rng.randrange(100) for _ in range(2048)])
        a += ["--val-data", val, "--eval-every", "2", "--eval-batches", "2"]
    if rng.random() < 0.5:
        a += ["--sample-every", "3", "--sample-tokens", "4", "--sample-prompt-ids", "1"]
    return a


def draw_placement(rng):
    """In memory, NVMe offload, or a Gemini policy (three tiers drawn), for the resume check."""
    a = []
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


def check_const(launch, binary, a, rng, work):
    """#10's "--const-budget caps gathered-chunk memory": const's device peak is at most static
    cpu placement's (every chunk gathered for its op only) plus the budget, with static's losses."""
    budget = rng.choice([256 << 10, 1 << 20, 4 << 20, 16 << 20])
    extra = ["--copy-worker", "on"] if rng.random() < 0.4 else []
    peaks, losses = [], []
    for g in (["--gemini", "static", "--offload-param-frac", "1", "--offload-optim-frac", "1"],
              ["--gemini", "const", "--const-budget", str(budget)] + extra):
        log = os.path.join(work, g[1] + ".jsonl")
        r = run(launch + [binary] + a + ["--device", "sim:4GiB", "--log", log] + g)
        if r.returncode != 0:
            return refused("EXIT", r, " ".join(a + g))
        peaks.append(max(json.loads(l)["device_peak_bytes"]["sim:0"] for l in open(log)))
        losses.append(re.findall(r"loss ([0-9.]+)", r.stdout))
    over = peaks[1] - peaks[0] - budget
    ok = over <= 0 and losses[0] == losses[1]
    print("ok  " if ok else "FAIL", f"budget {budget >> 10} KiB, static {peaks[0] / 2**20:.2f} "
          f"const {peaks[1] / 2**20:.2f} MiB", " ".join(a + extra),
          "" if ok else f"| over by {over} bytes, losses {losses}", flush=True)
    return 0 if ok else 1


def check_bitwise(launch, binary, a, g, work):
    """The plain run's losses, gradient norms, validation loss, sample and saved weights, bit for
    bit, and its saved model evaluates to the same loss when loaded into the drawn placement; a
    three-tier run leaves its --nvme-dir empty."""
    key = lambda r: (r["step"], r.get("loss"), r.get("grad_norm"), r.get("val_loss"))
    val = os.path.join(work, "val.bin")
    write_shard(val, random.Random(len(a)).choices(range(100), k=4096))  # every vocabulary has 100
    evaluate = ["--val-data", val, "--eval-batches", "2"]
    sample = ["--sample-every", "5", "--sample-tokens", "6", "--sample-prompt-ids", "1,2"]
    runs = []
    for extra, name in (([], "plain"), (g, "gemini")):
        log, out = os.path.join(work, name + ".jsonl"), os.path.join(work, name)
        nvme = os.path.join(work, name + "-nvme")
        os.mkdir(nvme)
        tiers = ["--nvme-dir", nvme] if "--host-capacity" in extra else []
        r = run(launch + [binary] + a + ["--device", "sim:4GiB", "--log", log, "--save", out]
                + evaluate + sample + extra + tiers)
        if r.returncode != 0 and name == "plain":
            return refused("EXIT", r, " ".join(a))
        if r.returncode != 0:
            print("FAIL", r.returncode, " ".join(a + extra), "|", last_line(r), flush=True)
            return 1
        with open(os.path.join(out, "model.safetensors"), "rb") as f:
            weights = f.read()
        runs.append(([key(json.loads(l)) for l in open(log)],
                     re.findall(r"sample ids: ([0-9,]+)", r.stdout), weights, os.listdir(nvme)))
    # The plain run's saved model, loaded into the drawn placement (through the tiers), evaluates
    # to the plain run's last validation loss.
    shape = [x for k in ("--batch", "--seq", "--precision") if k in a
             for x in (k, a[a.index(k) + 1])]
    nvme = os.path.join(work, "gemini-nvme")
    log = os.path.join(work, "eval.jsonl")
    tiers = ["--nvme-dir", nvme] if "--host-capacity" in g else []
    r = run(launch + [binary, "--eval-only", "--init-from", os.path.join(work, "plain"),
                      "--device", "sim:4GiB", "--log", log] + evaluate + shape + g + tiers)
    val = json.loads(open(log).readline()).get("val_loss") if r.returncode == 0 else None
    # gpt2_generate on the saved folder draws the sample the run printed after its last step.
    gen = run([os.path.join(os.path.dirname(binary), "gpt2_generate"), "--model",
               os.path.join(work, "plain"), "--prompt-ids", "1,2", "--print-ids",
               "--max-new-tokens", "6"])
    generated = re.findall(r"^ids: ([0-9,]+)", gen.stdout, re.M)
    (la, sa, wa, _), (lb, sb, wb, left) = runs
    left += os.listdir(nvme)
    why = ("losses" if la != lb or not any(x[3] for x in la) else
           "sample" if sa != sb or not sa else "saved weights" if wa != wb else
           f"gpt2_generate drew {generated}" if generated != sa[-1:] else
           f"files left in --nvme-dir: {left}" if left else
           f"--eval-only of the saved model: rc {r.returncode} {last_line(r)}, val loss {val}"
           if val != la[-1][3] else "")
    print("FAIL" if why else "ok  ", " ".join(a + g),
          f"| {why}: {la} vs {lb} | {sa} vs {sb}" if why else "", flush=True)
    return 1 if why else 0


def check_finetune(launch, binary, a, g, rng, work):
    """A user's fine-tune: a model trained and saved, then `--init-from` it on shards of text
    (`--data`), plain and in a drawn Gemini placement (through the tiers: the loader streams each
    tensor into its chunk): the same losses, norms and saved bytes, bit for bit."""
    base = os.path.join(work, "base")
    r = run(launch + [binary] + a + ["--save", base])
    if r.returncode != 0:
        return refused("EXIT", r, " ".join(a))
    tune = [x for k in ("--batch", "--seq", "--precision", "--grad-accum", "--grad-clip") if k in a
            for x in (k, a[a.index(k) + 1])] + ["--steps", "4", "--lr", "3e-3"]
    tune += draw_data(rng, a, work) or ["--data", write_data(rng, a, work)]
    runs = []
    for extra, name in (([], "plain"), (g, "gemini")):
        log, out = os.path.join(work, name + ".jsonl"), os.path.join(work, name)
        nvme = os.path.join(work, name + "-nvme")
        os.mkdir(nvme)
        tiers = ["--nvme-dir", nvme] if "--host-capacity" in extra else []
        r = run(launch + [binary, "--init-from", base, "--device", "sim:4GiB", "--log", log,
                          "--save", out] + tune + extra + tiers)
        if r.returncode != 0:
            print("FAIL" if name == "gemini" or crashed(r) else "EXIT", " ".join(tune + extra),
                  "|", last_line(r), flush=True)
            return 1 if name == "gemini" or crashed(r) else 0
        with open(os.path.join(out, "model.safetensors"), "rb") as f:
            runs.append(([(x["step"], x["loss"], x.get("grad_norm")) for x in
                          map(json.loads, open(log))], f.read(), os.listdir(nvme)))
    (la, wa, _), (lb, wb, left) = runs
    why = ("losses" if la != lb else "saved weights" if wa != wb else
           f"files left in --nvme-dir: {left}" if left else "")
    print("FAIL" if why else "ok  ", " ".join(a + ["->"] + tune + g),
          f"| {why}: {la} vs {lb}" if why else "", flush=True)
    return 1 if why else 0


def check_dp(binary, rng, work, ranks):
    a = [x for x in draw_training(rng) if x not in ("--precision", "bf16", "fp16")]
    if ranks != 2:  # the global batch splits evenly across the ranks
        a[a.index("--batch") + 1] = str(ranks * rng.choice([1, 2]))
    a += ["--lr", "1e-2", "--threads", "1"]  # fp32: the summation order is the only difference
    zero = rng.choice(["1", "2", "3"])
    g = draw_gemini(rng) if rng.random() < 0.6 else []
    if g and rng.random() < 0.3:
        g += ["--shard-param-frac", rng.choice(["0.3", "0.5"])]
    if g:
        g = ["--device", "sim:4GiB"] + g
    one, two = os.path.join(work, "one.jsonl"), os.path.join(work, "two.jsonl")
    r1 = run([binary] + a + ["--log", one])
    r2 = run(mpirun(ranks) + [binary] + a + g + ["--zero", zero, "--log", two])
    what = " ".join(a + g + ["--zero", zero])
    if r1.returncode or r2.returncode:
        return refused("EXIT", r2 if r2.returncode else r1, what)
    la = [json.loads(l)["loss"] for l in open(one)]
    lb = [json.loads(l)["loss"] for l in open(two)]
    worst = max(abs(x - y) for x, y in zip(la, lb)) if len(la) == len(lb) else float("inf")
    ok = worst < 1e-4
    print("ok  " if ok else "FAIL", f"{worst:.2e}", what, flush=True)
    return 0 if ok else 1


def check_dpbitwise(binary, rng, work):
    """Gemini's placements under data parallel: at 2 ranks, one ZeRO stage and one chunk size,
    every policy (fractions, budgets, copy worker, three tiers) trains bit for bit as static cpu
    placement (losses, norms, saved bytes): the chunks, their reductions and the norm's order are
    the same; only where the chunks live differs."""
    a = draw_training(rng) + ["--threads", "1", "--zero", rng.choice(["0", "2", "3"])]
    if a[-1] != "0" and rng.random() < 0.4:
        a += ["--shard-param-frac", rng.choice(["0.3", "0.5"])]
    cs = ["--chunk-size", str(rng.choice([20000, 50000, 300000]))]
    g = draw_gemini(rng)
    if "--chunk-size" in g:
        del g[g.index("--chunk-size"):g.index("--chunk-size") + 2]
    runs = []
    for name, placement in (("static", ["--gemini", "static", "--offload-param-frac", "1",
                                        "--offload-optim-frac", "1"]), ("drawn", g)):
        log, out = os.path.join(work, name + ".jsonl"), os.path.join(work, name)
        r = run(mpirun(2) + [binary] + a + cs + placement + ["--device", "sim:4GiB", "--log", log,
                                                             "--save", out])
        if r.returncode != 0:
            return refused("EXIT", r, " ".join(a + cs + placement))
        with open(os.path.join(out, "model.safetensors"), "rb") as f:
            runs.append(([(x["step"], x["loss"], x.get("grad_norm")) for x in
                          map(json.loads, open(log))], f.read()))
    ok = runs[0] == runs[1]
    print("ok  " if ok else "FAIL", " ".join(a + cs + g),
          "" if ok else f"| {'losses' if runs[0][0] != runs[1][0] else 'saved weights'}: "
          f"{runs[0][0]} vs {runs[1][0]}", flush=True)
    return 0 if ok else 1


def check_ranks(binary, rng, work):
    """#15's "checkpoints written at N ranks load at M ranks": a 2-rank run (drawn ZeRO stage,
    plain or Gemini) checkpointed after step 2, resumed at 1 or 4 ranks, logs the 2-rank run's
    steps 2-4 within the dp check's 1e-4 (the summation order differs with the rank count)."""
    a = [x for x in draw_training(rng) if x not in ("--precision", "bf16", "fp16")]
    a[a.index("--batch") + 1] = "4"  # splits over 1, 2 and 4 ranks
    a += ["--lr", "1e-2", "--threads", "1", "--zero", rng.choice(["0", "1", "2", "3"])]
    g = draw_gemini(rng) if rng.random() < 0.6 else []
    if g and rng.random() < 0.3 and a[-1] in ("2", "3"):
        g += ["--shard-param-frac", rng.choice(["0.3", "0.5"])]
    if g:
        g = ["--device", "sim:4GiB"] + g
    m = rng.choice([1, 4])
    ckpt, log, log2 = (os.path.join(work, n) for n in ("ckpt", "two.jsonl", "resumed.jsonl"))
    what = " ".join(a + g) + f" -> {m} rank(s)"
    r = run(mpirun(2) + [binary] + a + g + ["--checkpoint-dir", ckpt, "--checkpoint-every", "2",
                                             "--log", log])
    if r.returncode:
        return refused("EXIT", r, what)
    r2 = run(mpirun(m) + [binary] + a + g + ["--resume", os.path.join(ckpt, "step_000002"),
                                             "--log", log2])
    if r2.returncode:
        print("FAIL", what, "|", last_line(r2), flush=True)
        return 1
    want = [(x["step"], x["loss"]) for x in map(json.loads, open(log))][2:]
    got = [(x["step"], x["loss"]) for x in map(json.loads, open(log2))]
    worst = (max(abs(x[1] - y[1]) for x, y in zip(want, got))
             if [x[0] for x in want] == [y[0] for y in got] else float("inf"))
    ok = worst < 1e-4
    print("ok  " if ok else "FAIL", f"{worst:.2e}", what, flush=True)
    return 0 if ok else 1


def check_resume(launch, binary, a, placement, work, moved=None):
    """`moved`: the resumed run's placement, when it differs (the checkpoint's optimizer layout
    is mapped onto the new one, Note [Optimizer layouts]); the resume must not warn either."""
    key = lambda r: (r["step"], r.get("loss"), r.get("grad_norm"), r.get("val_loss"))
    # After the checkpoint of step 2: the steps from 2 on and the evaluations after 3 updates on.
    after = lambda k: k[0] >= 2 + (k[1] is None)
    samples = lambda r: [x for x in re.findall(r"^\[(\d+)\] sample ids: (\S+)", r.stdout, re.M)
                         if int(x[0]) > 2]
    straight, resumed = os.path.join(work, "a"), os.path.join(work, "b")
    r1 = run(launch + [binary] + a + placement + [
        "--checkpoint-dir", straight, "--checkpoint-every", "2", "--log", straight + ".jsonl"])
    if r1.returncode != 0:
        return refused("RUN-EXIT", r1, " ".join(a + placement))
    then = placement if moved is None else moved
    r2 = run(launch + [binary] + a + then + [
        "--checkpoint-dir", resumed, "--checkpoint-every", "2",
        "--resume", os.path.join(straight, "step_000002"), "--log", resumed + ".jsonl"])
    want = [k for k in map(key, map(json.loads, open(straight + ".jsonl"))) if after(k)]
    got = ([k for k in map(key, map(json.loads, open(resumed + ".jsonl"))) if after(k)]
           if os.path.exists(resumed + ".jsonl") else [])
    warned = "warning: resuming" in r2.stdout + r2.stderr
    ok = r2.returncode == 0 and got == want and not warned and samples(r1) == samples(r2)
    what = " ".join(a + placement)
    if moved is not None:
        what += " -> " + (" ".join(moved) or "plain")
    print("ok  " if ok else "FAIL", what, "" if ok else
          f"| rc {r2.returncode} {last_line(r2)} | warned {warned} | {want} vs {got}", flush=True)
    return 0 if ok else 1


def draw_fault(rng):
    """A training run whose disk traffic or file writes fail at a drawn request: (args, env)."""
    a = draw_training(rng)
    placement = rng.choice(["none", "nvme", "tiers", "tiers"])
    if placement == "nvme":
        a += ["--offload", "nvme", "--nvme-window", "1MiB"]
    elif placement == "tiers":
        a += ["--device", "sim:4GiB", "--gemini", rng.choice(["static", "auto", "const"]),
              "--host-capacity", rng.choice(["4MiB", "8MiB", "16MiB"]), "--nvme-window", "1MiB",
              "--chunk-size", rng.choice(["20000", "50000"])]  # small chunks, small slots
        if "const" in a:
            a += ["--const-budget", "1MiB"]
    disk = placement != "none" and rng.random() < 0.7
    var = "MW_IO_FAULT" if disk else "MW_WRITE_FAULT"
    kind = rng.choice(["eio", "read-eio"] if disk else ["enospc", "eio", "short"])
    return a, {var: f"{kind}@{rng.randint(1, 80 if disk else 14)}"}


def check_signal(launch, binary, a, placement, rng, work):
    """SIGTERM after a drawn step's loss line: exit 143 with a checkpoint of the step under way,
    which the message names, nothing left behind, and the resume gives the straight run's
    losses bit for bit. SIGKILL instead: the newest checkpoint is whole and resumes bit for
    bit, and that resume's saves remove what the killed run left half-written."""
    key = lambda r: (r["step"], r["loss"], r.get("grad_norm"))
    a = a[:a.index("--steps")] + ["--steps", "8"] + a[a.index("--steps") + 2:]
    on_disk = "--offload" in placement or "--host-capacity" in placement
    disk = lambda d: ["--nvme-dir", d] if on_disk else []
    straight = os.path.join(work, "straight.jsonl")
    r = run(launch + [binary] + a + placement + ["--log", straight])
    if r.returncode != 0:
        return refused("EXIT", r, " ".join(a + placement))
    want = [key(json.loads(l)) for l in open(straight)]
    sig = rng.choice([signal.SIGTERM, signal.SIGKILL])
    if launch:  # a SIGKILL would kill mpirun alone and leave its ranks running
        sig = signal.SIGTERM
    at = rng.randint(0, 5)  # the signal follows the loss line of step `at`
    ckpt, nvme, tmp = (os.path.join(work, n) for n in ("ckpt", "nvme", "tmp"))
    for d in (nvme, tmp):
        os.makedirs(d)
    keep = ["--keep", rng.choice(["1", "2"])] if rng.random() < 0.4 else []  # pruned as it goes
    cmd = launch + [binary] + a + placement + disk(nvme) + [
        "--checkpoint-dir", ckpt, "--checkpoint-every", "3"] + keep
    env = dict(os.environ, TMPDIR=tmp)
    if launch:  # rank 1 alone raises SIGTERM after step `at` (gpt2_train's test hook)
        env.update(MW_TEST_EXIT_RANK="1", MW_TEST_EXIT_STEP=str(at), MW_TEST_EXIT_HOW="sigterm")
        r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=900,
                           env=env)
        rc, out = r.returncode, [r.stdout, r.stderr]
    else:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             errors="replace", env=env)
        out = []
        for line in p.stdout:
            out.append(line)
            if line.startswith(f"[{at}] loss"):
                p.send_signal(sig)
                break
        out += p.stdout.readlines()
        rc = p.wait()
    what = f"{sig.name} after [{at}]: " + " ".join(a + placement + keep)
    text = "".join(out)
    steps = sorted(e for e in os.listdir(ckpt) if e.startswith("step_")) if os.path.isdir(
        ckpt) else []
    term = sig == signal.SIGTERM
    # The message names the step under way, which the run finished and checkpointed: one
    # process may be in any step after `at` when the signal lands (the pipe is read late under
    # load); the ranks agree after each step whether any of them got one, so there it is `at`.
    newest = int(steps[-1][5:]) if steps else 0
    during = [int(x) for x in re.findall(r"interrupted by SIGTERM during step (\d+)", text)]
    why = ("crashed" if "Sanitizer" in text or "runtime error:" in text else
           "" if not term else
           f"exit 0 before the last step (checkpoints {steps})" if rc == 0 and newest != 8 else
           "" if rc == 0 else  # the signal came after the last step
           f"exit {rc}, not 143" if rc != 128 + 15 and not launch else
           "no message" if not during else
           f"checkpoints {steps} after a SIGTERM during step {during[0]}"
           if newest != during[0] + 1 or during[0] < at or (launch and during[0] != at) else
           f"left {os.listdir(nvme) + os.listdir(tmp)}" if os.listdir(nvme) + os.listdir(tmp)
           else "")
    if not why and steps:  # the newest checkpoint resumes bit for bit
        log = os.path.join(work, "resumed.jsonl")
        rr = run(launch + [binary] + a + placement + disk(nvme) + [
            "--checkpoint-dir", ckpt, "--checkpoint-every", "3", "--resume", ckpt, "--log", log]
            + keep)
        k = int(steps[-1][5:])
        got = [key(json.loads(l)) for l in open(log)] if rr.returncode == 0 else []
        hidden = [e for e in os.listdir(ckpt) if e.startswith(".")]
        why = (f"resumed from {steps[-1]}: rc {rr.returncode} {last_line(rr)}" if got != want[k:]
               else f"the resume's saves left {hidden}" if hidden else "")
    print("FAIL" if why else "ok  ", f"rc {rc}", what, f"| {why}" if why else "", flush=True)
    return 1 if why else 0


def check_fault(launch, binary, a, env, work):
    """A run whose disk fails at a drawn request stops with exit 1 and a message, or, where it
    recovers (a short write) or the fault lies beyond its last request, ends as the clean run;
    either way it leaves no file in --nvme-dir or TMPDIR and no partial --save, and its latest
    checkpoint resumes to the clean run's losses bit for bit."""
    key = lambda r: (r["step"], r["loss"], r.get("grad_norm"))
    (var, spec), = env.items()
    # Under mpirun one rank's disk fails (rank 0's for file writes: it writes the checkpoints and
    # the model; rank 1's for I/O requests): the other ranks must stop too, not wait forever.
    rank = 0 if var == "MW_WRITE_FAULT" else 1
    one_rank = ["sh", "-c", f'[ "$OMPI_COMM_WORLD_RANK" = {rank} ] && export {var}={spec}; '
                'exec "$@"', "sh"] if launch else []
    runs = []
    for name, fault in (("clean", {}), ("fault", {} if launch else env)):
        d = {k: os.path.join(work, name, k) for k in ("ckpt", "nvme", "tmp", "save")}
        for k in ("ckpt", "nvme", "tmp"):
            os.makedirs(d[k])
        disk = ["--nvme-dir", d["nvme"]] if "--offload" in a or "--host-capacity" in a else []
        r = subprocess.run(launch + (one_rank if name == "fault" else []) + [binary] + a + disk + [
            "--checkpoint-dir", d["ckpt"], "--checkpoint-every", "2", "--save", d["save"],
            "--log", d["ckpt"] + ".jsonl"], capture_output=True, text=True, errors="replace",
            timeout=900, env=dict(os.environ, TMPDIR=d["tmp"], **fault))
        if name == "clean" and r.returncode != 0:
            return refused("EXIT", r, " ".join(a))
        log = d["ckpt"] + ".jsonl"
        records = [key(json.loads(l)) for l in open(log)] if os.path.exists(log) else []
        runs.append((r, d, records))
    (_, dc, want), (r, d, got) = runs
    what = " ".join(a) + " " + " ".join(f"{k}={v}" for k, v in env.items())
    left = os.listdir(d["nvme"]) + os.listdir(d["tmp"])
    left += [e for e in os.listdir(d["ckpt"]) if e.startswith(".")]
    same = lambda f: open(os.path.join(dc["save"], f), "rb").read() == open(
        os.path.join(d["save"], f), "rb").read()
    why = ("crashed" if crashed(r) else f"left {left}" if left else
           "" if r.returncode == 0 and got == want and same("model.safetensors") else
           "exit 0 with other losses or weights" if r.returncode == 0 else
           f"exit {r.returncode}" if r.returncode != 1 else
           "no error message" if "error: " not in r.stderr + r.stdout else
           "a partial --save" if os.path.exists(d["save"]) else "")
    steps = sorted(e for e in os.listdir(d["ckpt"]) if e.startswith("step_"))
    if not why and r.returncode != 0 and steps:  # the latest checkpoint resumes bit for bit
        k, log = int(steps[-1][5:]), os.path.join(work, "resumed.jsonl")
        disk = ["--nvme-dir", d["nvme"]] if "--offload" in a or "--host-capacity" in a else []
        rr = run(launch + [binary] + a + disk + ["--resume", os.path.join(d["ckpt"], steps[-1]),
                                                  "--log", log])
        resumed = [key(json.loads(l)) for l in open(log)] if rr.returncode == 0 else []
        why = "" if resumed == want[k:] else f"resumed from {steps[-1]}: {last_line(rr)}"
    print("FAIL" if why else "ok  ", f"rc {r.returncode}", what,
          f"| {why} | {last_line(r)}" if why else f"| {last_line(r)[:120]}", flush=True)
    return 1 if why else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("check",
                    choices=["auto", "bitwise", "dp", "resume", "fault", "const", "signal",
                             "ranks", "finetune", "dpbitwise"])
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--ranks", type=int, default=1, help="auto, dp, fault: mpirun -np N")
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "apps", "gpt2_train"))
    args = ap.parse_args()
    args.binary = os.path.abspath(args.binary)
    if args.check in ("bitwise", "finetune") and args.ranks > 1:
        ap.error(f"{args.check} compares with the plain run bit for bit: one process only (under "
                 "data parallel Gemini sums the tied embedding's gradient in another order)")
    rng = random.Random(args.seed)
    launch = mpirun(args.ranks)
    failures = 0
    for _ in range(args.runs):
        work = tempfile.mkdtemp(prefix="memwall-sweep-")
        try:
            if args.check == "auto":
                failures += check_auto(launch, args.binary, draw_auto(rng, args.ranks), rng, work)
            elif args.check == "dp":
                failures += check_dp(args.binary, rng, work, max(2, args.ranks))
            elif args.check == "bitwise":
                a = draw_training(rng)
                failures += check_bitwise(launch, args.binary, a, draw_gemini(rng), work)
            elif args.check == "const":
                failures += check_const(launch, args.binary, draw_auto(rng, args.ranks), rng, work)
            elif args.check == "dpbitwise":
                failures += check_dpbitwise(args.binary, rng, work)
            elif args.check == "finetune":
                a = draw_training(rng)
                failures += check_finetune(launch, args.binary, a, draw_gemini(rng), rng, work)
            elif args.check == "ranks":
                failures += check_ranks(args.binary, rng, work)
            elif args.check == "signal":
                a, placement = draw_training(rng), draw_placement(rng)
                a += draw_data(rng, a, work)
                failures += check_signal(launch, args.binary, a, placement, rng, work)
            elif args.check == "fault":
                failures += check_fault(launch, args.binary, *draw_fault(rng), work)
            else:
                a, placement = draw_training(rng), draw_placement(rng)
                a += draw_data(rng, a, work) + draw_between(rng, work)
                moved = draw_placement(rng) if rng.random() < 0.5 else None
                # Under mpirun, data parallel with and without Gemini reduce and sum gradients in
                # other orders (their weights differ in the last bits): a move keeps Gemini on or
                # off there.
                on = lambda p: "--gemini" in p
                if launch and moved is not None and on(moved) != on(placement):
                    moved = None
                failures += check_resume(launch, args.binary, a, placement, work, moved)
        except subprocess.TimeoutExpired:
            print("TIMEOUT", flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{args.runs} configurations, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
