"""What tools/auto_sweep.py's checks share: the draws of configurations, token shards, the
launcher, and how a run's outcome is judged (a refusal with a message, or a crash)."""
import json
import os
import re
import struct
import subprocess

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
    """bf16/fp16, --grad-accum 2 and --grad-clip 1, each drawn with its probability. Half the fp16
    runs start from a loss scale that overflows, so that the scaler skips steps (a checkpoint
    after a skip was refused on resume until session 38)."""
    a = []
    if rng.random() < p_precision:
        a += ["--precision", rng.choice(["bf16", "fp16"])]
        if a[-1] == "fp16" and rng.random() < 0.5:
            a += ["--initial-loss-scale", rng.choice(["1048576", "1073741824"])]
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


def draw_gemini(rng, a=()):
    """A Gemini placement; `a`: the run's other options (--precision draws the copies' dtype)."""
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
    if "--precision" in a and rng.random() < 0.3:  # Note [16-bit copies] off (on by default)
        g += ["--chunk-copy-dtype", "fp32"]
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


def draw_decay(rng):
    """A weight decay in 4 runs of 10 (its ranges inside Gemini's chunks follow a placement and a
    resume under another one, Note [Weight decay by ranges]), the rule drawn in half of those."""
    if rng.random() >= 0.4:
        return []
    return ["--weight-decay", "0.1"] + (["--weight-decay-on", "all"] if rng.random() < 0.5 else [])


def draw_optim(rng, a):
    """The optimizer's knobs (decay and what it takes, betas, eps, the floor of a schedule `a`
    draws, updates at the step), the same for both runs of the optim check; and a placement of
    the states and the
    parameters: NVMe offload (fraction, window, borrowed slots), the states on the sim device,
    or Gemini (auto with --gpu-margin-mem-ratio drawn, the states on NVMe drawn)."""
    k = ["--weight-decay", rng.choice(["0", "0.01", "0.1"]), "--beta1", rng.choice(["0.9", "0"]),
         "--beta2", rng.choice(["0.999", "0.95"]), "--eps", rng.choice(["1e-8", "1e-6", "1e-3"]),
         "--lr", rng.choice(["1e-3", "3e-3"])]
    if k[1] != "0" and rng.random() < 0.7:  # which parameters the decay takes
        k += ["--weight-decay-on", rng.choice(["matrices", "all"])]
    if a[a.index("--lr-schedule") + 1] != "constant":
        k += ["--min-lr", rng.choice(["0", "1e-4"])]
    if rng.random() < 0.3:
        k += ["--update-in-backward", "off"]
    where = rng.choice(["nvme", "states", "gemini"])
    p = ["--optimizer-states", "device"] if where == "states" else []
    if where != "gemini" and (where == "nvme" or rng.random() < 0.5):
        p += ["--offload", "nvme", "--fraction", rng.choice(["1", "0.5", "0.2"]),
              "--nvme-window", rng.choice(["1MiB", "32MiB"])]
        p += ["--nvme-borrow", "on"] if rng.random() < 0.5 else []
    if where == "gemini":
        p += draw_gemini(rng, a)
        if (p[p.index("--gemini") + 1] == "auto" and "--host-capacity" not in p
                and rng.random() < 0.6):  # the ratio refuses three tiers (a usage error)
            p += ["--gpu-margin-mem-ratio", rng.choice(["0.5", "1"])]
        if rng.random() < 0.4:  # the chunks' states on disk without a host budget, or part of them
            p += ["--offload", "nvme", "--fraction", rng.choice(["1", "0.5", "0.2"])]
    return k, p


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
    """Half the time each: evaluation every 2 steps (--val-data; then half the time with
    --save-best and --early-stop 1, whose best so far a resumed run must keep) and a sample every 3
    steps, the work a run does between steps, which must leave a resumed run as the straight one."""
    a = []
    if rng.random() < 0.5:
        val = os.path.join(work, "val.bin")
        write_shard(val, [rng.randrange(100) for _ in range(2048)])
        a += ["--val-data", val, "--eval-every", "2", "--eval-batches", "2"]
        if rng.random() < 0.5:
            a += ["--save-best", os.path.join(work, "best"), "--early-stop", "1"]
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


def run(cmd, env=None):
    return subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=900,
                          env=env)


def nvme_dir(args, d):
    """--nvme-dir d for a run whose arguments put anything on disk (NVMe offload, three tiers)."""
    return ["--nvme-dir", d] if "--offload" in args or "--host-capacity" in args else []


def crashed(r):
    """A refusal exits 1 or 2 with a message; a signal or a sanitizer report is a failure."""
    return r.returncode < 0 or "Sanitizer" in r.stderr or "runtime error:" in r.stderr


# Refusals counted by refused(), which a sweep bounds (too_many_refused): a binary that refused
# everything passed every sweep (a review's fake gpt2_train that only printed an error).
REFUSALS = [0]


def refused(tag, r, what):
    """Prints a run that stopped; returns the failures it counts for. A refusal (exit 1 or 2 with
    gpt2_train's error line, before any step: a drawn configuration the memory check or the
    options refuse) counts for none; a crash, a sanitizer report, or a stop after training began
    counts for one."""
    out = (r.stderr or "") + (r.stdout or "")
    refusal = (r.returncode in (1, 2) and not crashed(r) and "internal error" not in out
               and re.search(r"^gpt2_train: ", out, re.M) and "] loss:" not in (r.stdout or ""))
    REFUSALS[0] += 1 if refusal else 0
    print(tag if refusal else "FAIL", r.returncode, what, "|", last_line(r), flush=True)
    return 0 if refusal else 1


def too_many_refused(runs):
    """1 when more than a third of a sweep's `runs` configurations were refused (the drawn
    configurations are refused about one time in seven), else 0."""
    if 3 * REFUSALS[0] <= runs:
        return 0
    print(f"FAIL {REFUSALS[0]} of {runs} configurations were refused: more than a third", flush=True)
    return 1


def plain_and_gemini(cmd, g, work, plain=()):
    """Runs `cmd` (launcher, binary and arguments) on sim:4GiB plain (with `plain` added), then
    under the Gemini placement `g`, each with its own --log, --save and --nvme-dir. Returns, for
    each, its JSON log's records, its output, its saved model.safetensors and what it left in
    --nvme-dir; or, when a run stopped, the failures it counts for (the plain run's refusal counts
    for none)."""
    runs = []
    for extra, name in ((list(plain), "plain"), (g, "gemini")):
        log, out = os.path.join(work, name + ".jsonl"), os.path.join(work, name)
        nvme = os.path.join(work, name + "-nvme")
        os.mkdir(nvme)
        r = run(cmd + ["--device", "sim:4GiB", "--log", log, "--save", out] + extra
                + nvme_dir(extra, nvme))
        if r.returncode != 0 and name == "plain":
            return refused("EXIT", r, " ".join(cmd[1:]))
        if r.returncode != 0:
            print("FAIL", r.returncode, " ".join(cmd[1:] + extra), "|", last_line(r), flush=True)
            return 1
        with open(os.path.join(out, "model.safetensors"), "rb") as f:
            runs.append(([json.loads(l) for l in open(log)], r.stdout, f.read(), os.listdir(nvme)))
    return runs
