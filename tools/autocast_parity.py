#!/usr/bin/python3
"""bf16 mixed precision against PyTorch CPU autocast on the tiny GPT-2 (docs/precision.md).

Loads the gpt2_tiny fixture (tests/fixtures/gpt2_tiny: weights and the batch), runs 5 AdamW steps
(the fixture's hyper-parameters: lr 1e-3, weight decay 0.1 on every parameter) in fp32 and under
torch.autocast("cpu", dtype=torch.bfloat16), and prints the loss before each step. With --write it
stores them in tests/fixtures/gpt2_tiny/autocast_bf16.json, which tests/precision/parity_test.cpp
reads. With --memwall (default: on when the test binary exists) it also runs that test, which prints
memwall's fp32 and bf16 losses for the same steps, and prints the four side by side.

    /usr/bin/python3 tools/autocast_parity.py [--write] [--no-memwall]
"""
import argparse
import copy
import json
import os
import re
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt2 as tg  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(REPO_ROOT, "tests", "fixtures", "gpt2_tiny")
OUT = os.path.join(FIXTURE, "autocast_bf16.json")
TEST_BINARY = os.path.join(REPO_ROOT, "build", "tests", "test_precision")
ADAMW = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
STEPS = 5


def load_model():
    cfg = tg.read_config_json(os.path.join(FIXTURE, "config.json")).without_dropout()
    model = tg.GPT2LMHeadModel(cfg)
    tg.load_hf_state_dict(model, tg.load_safetensors(os.path.join(FIXTURE, "model.safetensors"))[0])
    model.eval()
    tokens = tg.load_safetensors(os.path.join(FIXTURE, "reference.safetensors"))[0]["tokens"]
    return model, tokens


def train(model, tokens, bf16):
    model = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = tg.lm_loss(model(tokens), tokens)
        loss.float().backward()
        opt.step()
        losses.append(loss.float().item())
    return losses


def memwall_losses():
    """Runs the parity test and parses the losses it prints; None when the binary is missing."""
    if not os.path.exists(TEST_BINARY):
        return None
    out = subprocess.run([TEST_BINARY, "--gtest_filter=AutocastParity.*"], capture_output=True,
                         text=True, check=False).stdout
    found = {}
    for kind in ("fp32", "bf16"):
        m = re.search(r"memwall %s losses: ([-0-9.e ]+)" % kind, out)
        if m:
            found[kind] = [float(v) for v in m.group(1).split()]
    return found or None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="store the torch losses in the fixture")
    ap.add_argument("--no-memwall", action="store_true", help="do not run the memwall test")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    model, tokens = load_model()
    ref = {"torch_fp32": train(model, tokens, False), "torch_bf16": train(model, tokens, True),
           "torch_version": torch.__version__, "steps": STEPS, "adamw": ADAMW,
           "note": "loss before each AdamW step; bf16 = torch.autocast('cpu', torch.bfloat16)"}
    if args.write:
        with open(OUT, "w") as f:
            json.dump(ref, f, indent=1, sort_keys=True)
            f.write("\n")
    ours = None if args.no_memwall else memwall_losses()
    cols = [("torch fp32", ref["torch_fp32"]), ("torch bf16", ref["torch_bf16"])]
    if ours:
        cols += [("memwall fp32", ours.get("fp32")), ("memwall bf16", ours.get("bf16"))]
    print("step " + " ".join("%13s" % name for name, _ in cols))
    for i in range(STEPS):
        print("%4d " % i + " ".join("%13.6f" % v[i] if v else "%13s" % "-" for _, v in cols))
    if ours and ours.get("bf16"):
        d = max(abs(a - b) for a, b in zip(ours["bf16"], ref["torch_bf16"]))
        d32 = max(abs(a - b) for a, b in zip(ref["torch_bf16"], ref["torch_fp32"]))
        print("max |memwall bf16 - torch bf16| = %.2e; max |torch bf16 - torch fp32| = %.2e" % (d, d32))


if __name__ == "__main__":
    main()
