#!/usr/bin/env python3
"""gpt2_train on random combinations of its options, good and bad: it must answer, never crash.

Each run draws one to five options from a pool of valid values, wrong values (negative sizes,
nan, unknown names), missing, truncated and wrong-kind files, and directories that do not exist,
on top of a tiny model (`--model tiny --steps 1|2 --batch 2 --seq 16`). A run passes when it
exits 0, or 1 or 2 with a message naming an error (docs/reliability.md: library code throws typed
exceptions, only main() turns them into exit codes), and leaves no `memwall-*` entry in TMPDIR.
A finding is any other exit (a signal, an abort), `terminate called` (an exception escaped), an
assertion, a sanitizer report, a timeout or a leftover file; the script exits 1 when there is one.

    /usr/bin/python3 tools/flag_fuzz.py --runs 150 --seed 2402
    /usr/bin/python3 tools/flag_fuzz.py --runs 40 --seed 2401 --binary build-asan/apps/gpt2_train

As root, the read-only directory of the pool is writable (root ignores the mode), so the
unwritable-path cases need an unprivileged user to bite; the missing-directory ones do not.
"""
import argparse
import collections
import glob
import os
import random
import re
import shutil
import subprocess
import tempfile

from sweep_lib import write_shard

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pool(w):
    """(option, values or None for a switch); `w` is the run's private workspace."""
    # A directory that does not exist, inside the workspace: gpt2_train creates an output's
    # missing directories, and "/nonexistent/..." left them on the machine, outside any cleanup.
    ro, missing = os.path.join(w, "ro"), os.path.join(w, "absent", "memwall-fuzz")
    text, trunc = os.path.join(w, "text.txt"), os.path.join(w, "trunc.bin")
    return [
        ("--device", ["cpu", "sim:1GiB", "sim:64MiB", "sim:1MiB", "sim:abc", "cuda"]),
        ("--gemini", ["static", "auto", "const", "bogus"]),
        ("--host-capacity", ["1MiB", "64MiB", "0", "-5"]),
        ("--offload", ["nvme", "none", "disk"]),
        ("--nvme-dir", [ro, missing, os.path.join(w, "nv")]),
        ("--data", [text, trunc, missing]),
        ("--val-data", [trunc, missing, os.path.join(w, "val.bin")]),
        ("--eval-every", ["1", "0", "-1"]),
        ("--save", [os.path.join(w, "out"), os.path.join(ro, "out"), missing + "/x"]),
        ("--save-best", [os.path.join(w, "best"), os.path.join(ro, "best"), os.path.join(w, "out")]),
        ("--early-stop", ["1", "0", "-1"]),
        ("--init-from", [trunc, missing, text]),
        ("--resume", [os.path.join(w, "ck"), missing]),
        ("--checkpoint-dir", [os.path.join(w, "ck"), os.path.join(ro, "ck")]),
        ("--checkpoint-every", ["1", "0"]),
        ("--lr", ["1e-3", "-1", "nan", "abc"]),
        ("--grad-accum", ["2", "0"]),
        ("--grad-clip", ["1", "-1"]),
        ("--precision", ["fp16", "bf16", "fp8"]),
        ("--chunk-size", ["1000", "0", "-1", "1e12"]),
        ("--zero", ["1", "3"]),
        ("--seq", ["1", "100000", "0"]),
        ("--batch", ["0", "1"]),
        ("--dropout", ["0.5", "1.5"]),
        ("--weight-decay", ["0.1", "0", "-1"]),
        ("--weight-decay-on", ["matrices", "all", "biases"]),
        ("--save-dtype", ["bf16", "fp16", "int8"]),
        ("--sample-every", ["1"]),
        ("--sample-tokens", ["4", "0"]),
        ("--trace", [os.path.join(w, "t.json"), os.path.join(ro, "t.json")]),
        ("--log", [os.path.join(w, "l.jsonl"), missing + "/l"]),
        ("--warmup-steps", ["5", "-1"]),
        ("--lr-schedule", ["cosine", "bogus"]),
        ("--nvme-window", ["1KiB", "1MiB"]),
        ("--checkpoint-segments", ["0", "2", "99"]),
        ("--offload-activations", None),
        ("--checkpoint-activations", None),
        ("--tokenizer", [missing]),
        ("--save-optimizer", [os.path.join(w, "o.bin"), os.path.join(ro, "o")]),
        ("--load-optimizer", [trunc]),
        ("--copy-worker", ["on", "off", "auto", "maybe"]),
        ("--chunk-copy-dtype", ["auto", "fp32", "bf16"]),
        ("--threads", ["1", "2"]),
    ]


def finding(r, out):
    if r.returncode not in (0, 1, 2):
        return f"exit {r.returncode}"
    if r.returncode != 0 and not re.search(r"^gpt2_train: ", out, re.M):
        return "a failing exit without gpt2_train's message"
    for sign in ("terminate called", "Assertion", "Sanitizer", "runtime error:", "internal error"):
        if sign in out:
            return sign
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "apps", "gpt2_train"))
    args = ap.parse_args()
    rng = random.Random(args.seed)
    tmp = tempfile.gettempdir()
    leftovers = lambda: set(glob.glob(os.path.join(tmp, "memwall-*")))
    before = leftovers()
    exits, findings = collections.Counter(), []
    w = tempfile.mkdtemp(prefix="fuzz-flags-")
    try:
        os.makedirs(os.path.join(w, "ro"))
        os.chmod(os.path.join(w, "ro"), 0o555)
        with open(os.path.join(w, "text.txt"), "w") as f:
            f.write("hello world. " * 2000)
        with open(os.path.join(w, "trunc.bin"), "wb") as f:
            f.write(b"\x01\x02\x03")
        write_shard(os.path.join(w, "val.bin"), [(i * 7) % 97 for i in range(4096)])
        # A control without drawn options must train: a binary that refused everything passed.
        control = ["--model", "tiny", "--steps", "1", "--batch", "2", "--seq", "16"]
        r = subprocess.run([args.binary] + control, capture_output=True, text=True,
                           errors="replace", timeout=120)
        if r.returncode != 0 or "[0] loss:" not in r.stdout:
            findings.append(("the control run failed", " ".join(control), r.stderr[-400:]))
        for _ in range(args.runs):
            a = ["--model", "tiny", "--steps", rng.choice(["1", "2"]), "--batch", "2", "--seq", "16"]
            for flag, values in rng.sample(pool(w), rng.randint(1, 5)):
                a += [flag] + ([rng.choice(values)] if values else [])
            try:
                r = subprocess.run([args.binary] + a, capture_output=True, text=True,
                                   errors="replace", timeout=120)
            except subprocess.TimeoutExpired:
                findings.append(("timeout", " ".join(a), ""))
                continue
            exits[r.returncode] += 1
            out = r.stderr + r.stdout
            what = finding(r, out)
            if what:
                findings.append((what, " ".join(a), out[-400:]))
            left = leftovers() - before
            if left:
                findings.append(("left behind " + " ".join(sorted(left)), " ".join(a), ""))
                before |= left
    finally:
        if os.path.isdir(os.path.join(w, "ro")):
            os.chmod(os.path.join(w, "ro"), 0o755)
        shutil.rmtree(w, ignore_errors=True)
    print("exit codes:", dict(sorted(exits.items())))
    for what, cmd, out in findings[:20]:
        print("FINDING", what, "|", cmd, "|", out.strip().replace("\n", " / "))
    print(f"{args.runs} runs, {len(findings)} findings")
    return 1 if findings else 0


if __name__ == "__main__":
    raise SystemExit(main())
