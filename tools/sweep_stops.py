"""tools/auto_sweep.py's checks of stopping and going on: resume (a resumed run against the
straight one, under another placement too), signal (SIGTERM/SIGKILL after a drawn step) and
fault (a disk failing at a drawn request). The promises are in auto_sweep.py's docstring."""
import json
import os
import re
import signal
import subprocess

from sweep_lib import crashed, draw_training, last_line, nvme_dir, refused, run


def check_resume(launch, binary, a, placement, work, moved=None, longer=False):
    """`moved`: the resumed run's placement, when it differs (the checkpoint's optimizer layout
    is mapped onto the new one, Note [Optimizer layouts]); the resume must not warn either.
    `longer`: the resume trains on to 7 steps, and must log a straight 7-step run's records
    (every update before step 2 had the rate it has under 7 steps: a constant schedule, or a
    decay's first update after a 1-step warmup), silently."""
    key = lambda r: (r["step"], r.get("loss"), r.get("grad_norm"), r.get("val_loss"), r.get("best"))
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
    if longer:  # the straight run of the new total is the reference
        a = list(a)
        a[a.index("--steps") + 1] = "7"
        r1 = run(launch + [binary] + a + placement + ["--log", straight + ".jsonl"])
        if r1.returncode != 0:
            return refused("RUN-EXIT", r1, " ".join(a + placement))
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
    if longer:
        what += " (resumed to --steps 7)"
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


def check_last_step(launch, binary, a, placement, work):
    """SIGTERM after the last step (rank 1's alone under mpirun), without --checkpoint-dir: the
    run finishes --save and --save-optimizer, exits 143 saying so, and both files equal the
    straight run's; nothing is left in --nvme-dir or TMPDIR (Note [Stop signals])."""
    d = {k: os.path.join(work, k) for k in ("nvme", "tmp", "a", "b")}
    for k in ("nvme", "tmp"):
        os.makedirs(d[k])
    env = dict(os.environ, TMPDIR=d["tmp"])
    runs = []
    for name, hook in (("a", {}), ("b", dict(MW_TEST_EXIT_RANK="1" if launch else "0",
                                             MW_TEST_EXIT_STEP="7", MW_TEST_EXIT_HOW="sigterm"))):
        runs.append(run(launch + [binary] + a + placement + nvme_dir(placement, d["nvme"]) + [
            "--save", d[name], "--save-optimizer", d[name] + ".opt"], dict(env, **hook)))
    (r1, r2), what = runs, "SIGTERM after the last step: " + " ".join(a + placement)
    if r1.returncode != 0:
        return refused("EXIT", r1, what)
    same = lambda f: all(os.path.exists(d[n] + f) for n in "ab") and open(
        d["a"] + f, "rb").read() == open(d["b"] + f, "rb").read()
    left = os.listdir(d["nvme"]) + os.listdir(d["tmp"])
    why = ("crashed" if crashed(r2) else f"left {left}" if left else
           f"exit {r2.returncode}" if r2.returncode != 143 and not (launch and r2.returncode) else
           "no message" if "after the last step: finished its saves first" not in
           r2.stdout + r2.stderr else
           "another model" if not same("/model.safetensors") else
           "another optimizer file" if not same(".opt") else "")
    print("FAIL" if why else "ok  ", f"rc {r2.returncode}", what, f"| {why}" if why else "",
          flush=True)
    return 1 if why else 0


def check_signal(launch, binary, a, placement, rng, work):
    """SIGTERM after a drawn step's loss line: exit 143 with a checkpoint of the step under way,
    which the message names, nothing left behind, and the resume gives the straight run's
    losses bit for bit. SIGKILL instead: the newest checkpoint is whole and resumes bit for
    bit, and that resume's saves remove what the killed run left half-written."""
    key = lambda r: (r["step"], r["loss"], r.get("grad_norm"))
    a = a[:a.index("--steps")] + ["--steps", "8"] + a[a.index("--steps") + 2:]
    if rng.random() < 0.25:
        return check_last_step(launch, binary, a, placement, work)
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
    cmd = launch + [binary] + a + placement + nvme_dir(placement, nvme) + [
        "--checkpoint-dir", ckpt, "--checkpoint-every", "3"] + keep
    env = dict(os.environ, TMPDIR=tmp)
    if launch:  # rank 1 alone raises SIGTERM after step `at` (gpt2_train's test hook)
        env.update(MW_TEST_EXIT_RANK="1", MW_TEST_EXIT_STEP=str(at), MW_TEST_EXIT_HOW="sigterm")
        r = run(cmd, env)
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
           # in the last step (read late under load): the run ends whole, saves and all
           "" if newest == 8 and "interrupted by SIGTERM after the last step" in text else
           "no message" if not during else
           f"checkpoints {steps} after a SIGTERM during step {during[0]}"
           if newest != during[0] + 1 or during[0] < at or (launch and during[0] != at) else
           f"left {os.listdir(nvme) + os.listdir(tmp)}" if os.listdir(nvme) + os.listdir(tmp)
           else "")
    if not why and steps:  # the newest checkpoint resumes bit for bit
        log = os.path.join(work, "resumed.jsonl")
        rr = run(launch + [binary] + a + placement + nvme_dir(placement, nvme) + [
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
        outputs = ["--checkpoint-dir", d["ckpt"], "--checkpoint-every", "2", "--save", d["save"],
                   "--log", d["ckpt"] + ".jsonl"]
        r = run(launch + (one_rank if name == "fault" else []) + [binary] + a
                + nvme_dir(a, d["nvme"]) + outputs, dict(os.environ, TMPDIR=d["tmp"], **fault))
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
