#!/usr/bin/env python3
"""Promises of Gemini, data parallel, resumption and failing disks, on random configurations.

Twelve checks of promises the tests make on a few cases only, drawn over many
(docs/reliability.md):

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
          stop. One run in four instead gets SIGTERM after its last step, without checkpoints:
          it must finish --save and --save-optimizer (equal to the straight run's), exit 143
          saying so, and leave nothing behind.
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
          --shard-param-frac drawn; half the runs under MW_DIST_DEVICE_MEMORY=sim, NCCL's
          memory rule) against one plain process, fp32 at lr 1e-2, every loss
          within 1e-4 (tests/dist/dist_train.h: the summation order differs by ~1 ulp; a
          missed or doubled update moves a loss by 1e-3 or more); half the runs evaluate
          every 2 steps on a validation shard of 300-4096 tokens, and each validation loss
          must be within 1e-4 too (each rank scores its own rows). Refused combinations print
          EXIT.
  dpbitwise Gemini under data parallel: at 2 ranks, a drawn ZeRO stage (0, 2, 3, sharded
          parameters drawn) and one chunk size, a drawn policy (fractions, budgets, copy worker,
          three tiers; half of them under MW_DIST_DEVICE_MEMORY=sim, NCCL's memory rule) trains
          bit for bit as static cpu placement (losses, norms, saved bytes).
  zero3low plain ZeRO 3's 16-bit gathers (Note [16-bit parameter gathers]): at 2 ranks under
          bf16 or fp16 (bucket size, accumulation, clipping, recomputation, decay drawn; half
          the runs under MW_DIST_DEVICE_MEMORY=sim) bit for bit as the f32 gathers
          (--chunk-copy-dtype fp32): losses, norms, saved bytes, and no more all_gather bytes.
  finetune a user's fine-tune: a model trained and saved, then `--init-from` it on 1-3 shards
          of tokens (--data, --shuffle drawn), plain and in a drawn Gemini placement (three
          tiers drawn: the loader streams each tensor into its chunk): the same losses, norms
          and saved bytes, bit for bit (one process).
  optim   the optimizer's knobs (--weight-decay and --weight-decay-on, --beta1/2, --eps, --lr, --min-lr,
          --update-in-backward off) drawn for a run in memory (half the time with the scalar
          reference, --optimizer adamw) and for the same run with its states or parameters
          placed elsewhere (NVMe offload at a drawn fraction, window and --nvme-borrow; the
          states on the sim device; a Gemini policy, auto with --gpu-margin-mem-ratio, its
          states on NVMe with --offload nvme drawn): the same losses, gradient norms (where
          both runs log one) and saved bytes, bit for bit, and nothing left in --nvme-dir.
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
          checkpoint must be the straight run's too); 3 in 10 resumes train on to --steps 7
          and must log a straight 7-step run's steps, silently (no earlier update's learning
          rate changes with the total).
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
    /usr/bin/python3 tools/auto_sweep.py optim --runs 100 --seed 2806

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

from sweep_lib import (ROOT, draw_auto, draw_between, draw_data, draw_decay, draw_gemini,
                       draw_optim, draw_placement, draw_training, last_line, mpirun, nvme_dir,
                       plain_and_gemini, refused, run, too_many_refused, write_data,
                       write_shard)
from sweep_stops import check_fault, check_resume, check_signal, draw_fault


def json_losses(log):
    """The training losses of a --log file, every bit (none when it has no records)."""
    if not os.path.exists(log):
        return []
    records = [json.loads(l) for l in open(log) if l.strip()]
    return [r["loss"] for r in records if "loss" in r]


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
    losses = json_losses(log)  # every bit: the printed ones have three decimals
    failures = 0
    for extra in [[]] + ([["--copy-worker", "on"]] if rng.random() < 0.4 else []):
        au_log = os.path.join(work, "auto.jsonl")
        au = run(launch + [binary] + a + ["--device", f"sim:{cap}", "--gemini", "auto", "--log",
                                          au_log] + extra)
        ok = au.returncode == 0 and losses and json_losses(au_log) == losses
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
        losses.append(json_losses(log))
    over = peaks[1] - peaks[0] - budget
    ok = over <= 0 and losses[0] and losses[0] == losses[1]
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
    runs = plain_and_gemini(launch + [binary] + a + evaluate + sample, g, work)
    if isinstance(runs, int):
        return runs
    # The plain run's saved model, loaded into the drawn placement (through the tiers), evaluates
    # to the plain run's last validation loss.
    shape = [x for k in ("--batch", "--seq", "--precision") if k in a
             for x in (k, a[a.index(k) + 1])]
    nvme = os.path.join(work, "gemini-nvme")
    log = os.path.join(work, "eval.jsonl")
    r = run(launch + [binary, "--eval-only", "--init-from", os.path.join(work, "plain"),
                      "--device", "sim:4GiB", "--log", log] + evaluate + shape + g
            + nvme_dir(g, nvme))
    val = json.loads(open(log).readline()).get("val_loss") if r.returncode == 0 else None
    # gpt2_generate on the saved folder draws the sample the run printed after its last step.
    gen = run([os.path.join(os.path.dirname(binary), "gpt2_generate"), "--model",
               os.path.join(work, "plain"), "--prompt-ids", "1,2", "--print-ids",
               "--max-new-tokens", "6"])
    generated = re.findall(r"^ids: ([0-9,]+)", gen.stdout, re.M)
    (la, sa, wa, _), (lb, sb, wb, left) = ((list(map(key, records)),
                                            re.findall(r"sample ids: ([0-9,]+)", out), w, left)
                                           for records, out, w, left in runs)
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


def check_optim(launch, binary, a, p, rng, work):
    """The optimizer's knobs drawn (draw_optim) give the same losses, norms (where both runs log
    one) and saved bytes in memory (half the time with the scalar reference, --optimizer adamw)
    and under the drawn placement, which leaves --nvme-dir empty."""
    reference = ["--optimizer", "adamw"] if rng.random() < 0.5 else []
    runs = plain_and_gemini(launch + [binary] + a, p, work, reference)
    if isinstance(runs, int):
        return runs
    (la, na, wa, _), (lb, nb, wb, left) = (
        ([(x["step"], x["loss"]) for x in records], [x.get("grad_norm") for x in records], w, left)
        for records, _, w, left in runs)
    norms = [(x, y) for x, y in zip(na, nb) if x is not None and y is not None and x != y]
    why = ("losses" if la != lb else f"norms {norms}" if norms else
           "saved weights" if wa != wb else f"files left in --nvme-dir: {left}" if left else "")
    print("FAIL" if why else "ok  ", " ".join(a + reference + ["vs"] + p),
          f"| {why}: {la} vs {lb}" if why else "", flush=True)
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
    runs = plain_and_gemini(launch + [binary, "--init-from", base] + tune, g, work)
    if isinstance(runs, int):
        return runs
    (la, _, wa, _), (lb, _, wb, left) = (
        ([(x["step"], x["loss"], x.get("grad_norm")) for x in records], out, w, left)
        for records, out, w, left in runs)
    why = ("losses" if la != lb else "saved weights" if wa != wb else
           f"files left in --nvme-dir: {left}" if left else "")
    print("FAIL" if why else "ok  ", " ".join(a + ["->"] + tune + g),
          f"| {why}: {la} vs {lb}" if why else "", flush=True)
    return 1 if why else 0


def fp32_only(args):
    """The drawn training options without their precision and fp16's --initial-loss-scale (which
    a run in another precision refuses)."""
    out, skip = [], False
    for x in args:
        if skip or x in ("--precision", "bf16", "fp16"):
            skip = False
            continue
        if x == "--initial-loss-scale":
            skip = True
            continue
        out.append(x)
    return out


def check_dp(binary, rng, work, ranks):
    a = fp32_only(draw_training(rng))
    if ranks != 2:  # the global batch splits evenly across the ranks
        a[a.index("--batch") + 1] = str(ranks * rng.choice([1, 2]))
    a += ["--lr", "1e-2", "--threads", "1"]  # fp32: the summation order is the only difference
    if rng.random() < 0.4:  # large: the LayerNorms' 1% a step shows in the losses if mistaken
        a += ["--weight-decay", "1", "--weight-decay-on", rng.choice(["matrices", "all"])]
    zero = rng.choice(["1", "2", "3"])
    g = draw_gemini(rng) if rng.random() < 0.6 else []
    if g and rng.random() < 0.3:
        g += ["--shard-param-frac", rng.choice(["0.3", "0.5"])]
    if g:
        g = ["--device", "sim:4GiB"] + g
    # Note [Device memory on the CPU]: half the runs under NCCL's rule (every collective's tensors
    # on the device), the sim device standing in for the rank's GPU.
    memory = rng.random() < 0.5
    if memory and not g:
        g = ["--device", "sim:4GiB"]
    env = dict(os.environ, MW_DIST_DEVICE_MEMORY="sim") if memory else None
    if rng.random() < 0.5:  # Note [Evaluation windows]: each rank scores its rows of a batch
        val = os.path.join(work, "val.bin")
        write_shard(val, rng.choices(range(100), k=rng.choice([300, 1000, 4096])))
        a += ["--val-data", val, "--eval-every", "2", "--eval-batches", rng.choice(["1", "3", "50"])]
    one, two = os.path.join(work, "one.jsonl"), os.path.join(work, "two.jsonl")
    r1 = run([binary] + a + ["--log", one])
    r2 = run(mpirun(ranks) + [binary] + a + g + ["--zero", zero, "--log", two], env=env)
    what = " ".join(a + g + ["--zero", zero]) + (" [MW_DIST_DEVICE_MEMORY=sim]" if memory else "")
    if r1.returncode or r2.returncode:
        return refused("EXIT", r2 if r2.returncode else r1, what)
    def logged(path):  # the steps' losses and the evaluations' (whose lines hold val_loss)
        return [r.get("loss", r.get("val_loss")) for r in map(json.loads, open(path))]
    la, lb = logged(one), logged(two)
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
    if rng.random() < 0.4:  # the chunks' and pieces' ranges left undecayed
        a += ["--weight-decay", "0.1"]
    if a[a.index("--zero") + 1] != "0" and rng.random() < 0.4:
        a += ["--shard-param-frac", rng.choice(["0.3", "0.5"])]
    cs = ["--chunk-size", str(rng.choice([20000, 50000, 300000]))]
    g = draw_gemini(rng)
    if "--chunk-size" in g:
        del g[g.index("--chunk-size"):g.index("--chunk-size") + 2]
    # Note [Staged collectives]: half the drawn runs under NCCL's memory rule, their collectives
    # through device copies, which must not change a bit.
    memory = rng.random() < 0.5
    runs = []
    for name, placement in (("static", ["--gemini", "static", "--offload-param-frac", "1",
                                        "--offload-optim-frac", "1"]), ("drawn", g)):
        log, out = os.path.join(work, name + ".jsonl"), os.path.join(work, name)
        env = dict(os.environ, MW_DIST_DEVICE_MEMORY="sim") if memory and name == "drawn" else None
        r = run(mpirun(2) + [binary] + a + cs + placement + ["--device", "sim:4GiB", "--log", log,
                                                             "--save", out], env=env)
        if r.returncode != 0:
            return refused("EXIT", r, " ".join(a + cs + placement))
        with open(os.path.join(out, "model.safetensors"), "rb") as f:
            runs.append(([(x["step"], x["loss"], x.get("grad_norm")) for x in
                          map(json.loads, open(log))], f.read()))
    ok = runs[0] == runs[1]
    print("ok  " if ok else "FAIL", " ".join(a + cs + g) + (" [MW_DIST_DEVICE_MEMORY=sim]"
                                                            if memory else ""),
          "" if ok else f"| {'losses' if runs[0][0] != runs[1][0] else 'saved weights'}: "
          f"{runs[0][0]} vs {runs[1][0]}", flush=True)
    return 0 if ok else 1


def check_zero3low(binary, rng, work):
    """Note [16-bit parameter gathers]: plain ZeRO 3 at 2 ranks under bf16 or fp16 (bucket size,
    accumulation, clipping, recomputation, dropout, decay drawn; half the runs under
    MW_DIST_DEVICE_MEMORY=sim, NCCL's memory rule and its receive buffers) gathers the blocks'
    matrices in 2 bytes and trains bit for bit as its f32 gathers (--chunk-copy-dtype fp32, the
    same layout): losses, norms and saved bytes, and no more all_gather bytes."""
    a = fp32_only(draw_training(rng))
    a += ["--precision", rng.choice(["bf16", "fp16"]), "--threads", "1", "--zero", "3",
          "--bucket-mb", rng.choice(["0.01", "0.05", "25"])] + draw_decay(rng)
    memory = rng.random() < 0.5
    if memory:
        a += ["--device", "sim:4GiB"]
    runs = []
    for name, extra in (("f32", ["--chunk-copy-dtype", "fp32"]), ("low", [])):
        log, out = os.path.join(work, name + ".jsonl"), os.path.join(work, name)
        # Both under the rule: it declines the embedding's split reduction (Note [Buckets on
        # CUDA]), which sums wte's gradient in another order.
        env = dict(os.environ, MW_DIST_DEVICE_MEMORY="sim") if memory else None
        r = run(mpirun(2) + [binary] + a + extra + ["--log", log, "--save", out], env=env)
        if r.returncode != 0:
            return refused("EXIT", r, " ".join(a + extra))
        with open(os.path.join(out, "model.safetensors"), "rb") as f:
            runs.append(([(x["step"], x["loss"], x.get("grad_norm"), x.get("all_gather_bytes"))
                          for x in map(json.loads, open(log))], f.read()))
    same = [r[:3] for r in runs[0][0]] == [r[:3] for r in runs[1][0]]
    # No more bytes; as many where a bucket's f32 part (embeddings, LayerNorms, biases) is over
    # 1/2 of it, so that rank 0's slot is all f32 (a one-bucket model with a wide wpe).
    sent = [sum(r[3] or 0 for r in runs[k][0]) for k in (0, 1)]
    fewer = sent[1] <= sent[0]
    ok = same and runs[0][1] == runs[1][1] and fewer
    print("ok  " if ok else "FAIL", " ".join(a) + (" [MW_DIST_DEVICE_MEMORY=sim]" if memory else ""),
          f"| all_gather {sent[1] / max(1, sent[0]):.3f}x f32's" if ok else
          f"| {'losses' if not same else 'bytes' if not fewer else 'saved weights'}: "
          f"{runs[0][0]} vs {runs[1][0]}", flush=True)
    return 0 if ok else 1


def check_ranks(binary, rng, work):
    """#15's "checkpoints written at N ranks load at M ranks": a 2-rank run (drawn ZeRO stage,
    plain or Gemini) checkpointed after step 2, resumed at 1 or 4 ranks, logs the 2-rank run's
    steps 2-4 within the dp check's 1e-4 (the summation order differs with the rank count)."""
    a = fp32_only(draw_training(rng))
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("check",
                    choices=["auto", "bitwise", "dp", "resume", "fault", "const", "signal",
                             "ranks", "finetune", "dpbitwise", "optim", "zero3low"])
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--ranks", type=int, default=1, help="auto, dp, fault: mpirun -np N")
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "apps", "gpt2_train"))
    args = ap.parse_args()
    args.binary = os.path.abspath(args.binary)
    if args.check in ("bitwise", "finetune", "optim") and args.ranks > 1:
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
                a = draw_training(rng) + draw_decay(rng)
                failures += check_bitwise(launch, args.binary, a, draw_gemini(rng, a), work)
            elif args.check == "const":
                failures += check_const(launch, args.binary, draw_auto(rng, args.ranks), rng, work)
            elif args.check == "dpbitwise":
                failures += check_dpbitwise(args.binary, rng, work)
            elif args.check == "zero3low":
                failures += check_zero3low(args.binary, rng, work)
            elif args.check == "finetune":
                a = draw_training(rng)
                failures += check_finetune(launch, args.binary, a, draw_gemini(rng, a), rng, work)
            elif args.check == "optim":
                a = draw_training(rng)
                knobs, p = draw_optim(rng, a)
                failures += check_optim(launch, args.binary, a + knobs, p, rng, work)
            elif args.check == "ranks":
                failures += check_ranks(args.binary, rng, work)
            elif args.check == "signal":
                a, placement = draw_training(rng) + draw_decay(rng), draw_placement(rng)
                a += draw_data(rng, a, work)
                failures += check_signal(launch, args.binary, a, placement, rng, work)
            elif args.check == "fault":
                failures += check_fault(launch, args.binary, *draw_fault(rng), work)
            else:
                a, placement = draw_training(rng) + draw_decay(rng), draw_placement(rng)
                a += draw_data(rng, a, work) + draw_between(rng, work)
                moved = draw_placement(rng) if rng.random() < 0.5 else None
                # Under mpirun, data parallel with and without Gemini reduce and sum gradients in
                # other orders (their weights differ in the last bits): a move keeps Gemini on or
                # off there.
                on = lambda p: "--gemini" in p
                if launch and moved is not None and on(moved) != on(placement):
                    moved = None
                longer = rng.random() < 0.3
                failures += check_resume(launch, args.binary, a, placement, work, moved, longer)
        except subprocess.TimeoutExpired:
            print("FAIL TIMEOUT", flush=True)  # a hang is a failure (it counted for none)
            failures += 1
        finally:
            shutil.rmtree(work, ignore_errors=True)
    failures += too_many_refused(args.runs)
    print(f"{args.runs} configurations, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())

