#!/usr/bin/python3
"""Writes the GPT-2 parity fixture tests/fixtures/gpt2_tiny/ from the plain-torch reference model.

Usage (from the repository root, with Debian's torch; NOT the pyenv python on PATH):

    /usr/bin/python3 tools/make_gpt2_reference.py            # (re)write tests/fixtures/gpt2_tiny/
    /usr/bin/python3 tools/make_gpt2_reference.py --check    # regenerate in memory, compare with the
                                                             # committed files bit for bit (exit 1 on diff)
    /usr/bin/python3 tools/make_gpt2_reference.py --out DIR  # write somewhere else

The model is a tiny GPT-2 (n_layer 2, n_head 4, n_embd 32, vocab_size 97, n_positions 32, dropout 0),
initialised HF-style from torch.manual_seed(SEED); the batch is B=2, T=16 tokens drawn uniformly from
[0, 97) by a torch.Generator seeded with SEED + 1. Everything runs on one CPU thread with deterministic
algorithms, so the output is the same bytes on every run of the same torch build (--check proves it).

Files written (the C++ GPT-2 loads the first two as an HF checkpoint and compares against the third):
  config.json            HF GPT2Config keys (model_type gpt2, activation_function gelu_new, ...)
  model.safetensors      F32 weights, HF names, Conv1D [in, out] layout, no lm_head.weight (tied)
  reference.safetensors
      tokens                   I64 [B, T]
      logits                   F32 [B, T, V]     forward of the f32 model
      loss                     F32 [1]           mean CE(logits[:, :-1], tokens[:, 1:])
      grad.<hf name>           F32 (param shape) d loss / d param; wte's includes the LM-head term
      f64.logits, f64.loss, f64.grad.<hf name>   F64, the same model converted to float64 from the
                                                 same f32 weights (a much tighter target for a
                                                 double-precision C++ run)
      adamw_losses             F32 [10]          loss *before* each of 10 torch.optim.AdamW steps on
                                                 that batch (fp32, from the model.safetensors weights)
      adamw_final.<hf name>    F32 (param shape) weights after the 10th step
  The hyper-parameters are repeated in reference.safetensors' "__metadata__".
"""

import argparse
import copy
import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt2 as tg  # noqa: E402

SEED = 1337
BATCH = 2
SEQ = 16
ADAMW = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
ADAMW_STEPS = 10
TINY = tg.GPT2Config(
    n_layer=2, n_head=4, n_embd=32, vocab_size=97, n_positions=32
).without_dropout()

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO_ROOT, "tests", "fixtures", "gpt2_tiny")


def forward_backward(model, tokens):
    """Returns (logits, loss, {hf name: grad}) for one forward + backward from zero grads."""
    model.zero_grad(set_to_none=True)
    logits = model(tokens)
    loss = tg.lm_loss(logits, tokens)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in tg.hf_state_dict(model).items()}
    return logits.detach(), loss.detach(), grads


def build():
    """Returns (weights, reference tensors, reference metadata); all deterministic."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(SEED)
    model = tg.GPT2LMHeadModel(TINY)
    model.eval()  # dropout is 0 anyway; eval makes that explicit
    weights = {n: p.detach().clone() for n, p in tg.hf_state_dict(model).items()}
    assert list(weights) == tg.parameter_names(TINY)

    gen = torch.Generator().manual_seed(SEED + 1)
    tokens = torch.randint(0, TINY.vocab_size, (BATCH, SEQ), generator=gen, dtype=torch.int64)

    ref = {"tokens": tokens}
    logits, loss, grads = forward_backward(model, tokens)
    ref["logits"] = logits
    ref["loss"] = loss.reshape(1)
    for n, g in grads.items():
        ref["grad." + n] = g

    model64 = copy.deepcopy(model).double()
    logits64, loss64, grads64 = forward_backward(model64, tokens)
    ref["f64.logits"] = logits64
    ref["f64.loss"] = loss64.reshape(1)
    for n, g in grads64.items():
        ref["f64.grad." + n] = g

    opt_model = copy.deepcopy(model)
    opt = torch.optim.AdamW(opt_model.parameters(), **ADAMW)
    losses = []
    for _ in range(ADAMW_STEPS):
        opt.zero_grad(set_to_none=True)
        step_loss = tg.lm_loss(opt_model(tokens), tokens)
        step_loss.backward()
        opt.step()
        losses.append(step_loss.item())
    ref["adamw_losses"] = torch.tensor(losses, dtype=torch.float32)
    for n, p in tg.hf_state_dict(opt_model).items():
        ref["adamw_final." + n] = p.detach().clone()

    meta = {
        "generator": "tools/make_gpt2_reference.py",
        "torch_version": torch.__version__,
        "seed": SEED,
        "batch": BATCH,
        "seq": SEQ,
        "config": json.dumps(tg.config_to_hf_dict(TINY), sort_keys=True),
        "loss": "mean cross_entropy(logits[:, :-1], tokens[:, 1:])",
        "adamw_lr": ADAMW["lr"],
        "adamw_beta1": ADAMW["betas"][0],
        "adamw_beta2": ADAMW["betas"][1],
        "adamw_eps": ADAMW["eps"],
        "adamw_weight_decay": ADAMW["weight_decay"],
        "adamw_steps": ADAMW_STEPS,
        "adamw_note": "torch.optim.AdamW (decoupled decay on every parameter incl. biases, LN, "
        "embeddings), fp32, adamw_losses[i] is the loss before step i+1",
        "num_threads": 1,
    }
    return weights, ref, meta


def write(out_dir, weights, ref, meta):
    os.makedirs(out_dir, exist_ok=True)
    tg.write_config_json(os.path.join(out_dir, "config.json"), TINY)
    tg.save_safetensors(
        os.path.join(out_dir, "model.safetensors"),
        weights,
        {"format": "pt", "generator": meta["generator"], "seed": SEED},
    )
    tg.save_safetensors(os.path.join(out_dir, "reference.safetensors"), ref, meta)


def summarize(ref):
    print(f"loss f32 {ref['loss'].item():.7f}  f64 {ref['f64.loss'].item():.15f}")
    worst = max(
        ((ref[k].double() - ref["f64." + k]).abs().max().item(), k)
        for k in ref
        if k.startswith("grad.")
    )
    print(f"largest |f32 grad - f64 grad|: {worst[0]:.3e} ({worst[1]})")
    print("adamw_losses:", " ".join(f"{x:.6f}" for x in ref["adamw_losses"].tolist()))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help="output folder (default tests/fixtures/gpt2_tiny)")
    ap.add_argument("--check", action="store_true", help="compare a fresh build with the files in --out")
    args = ap.parse_args()

    weights, ref, meta = build()
    summarize(ref)
    if not args.check:
        write(args.out, weights, ref, meta)
        total = sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out))
        print(f"wrote {args.out} ({total} bytes)")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        write(tmp, weights, ref, meta)
        bad = []
        for f in ("config.json", "model.safetensors", "reference.safetensors"):
            with open(os.path.join(tmp, f), "rb") as a, open(os.path.join(args.out, f), "rb") as b:
                if a.read() != b.read():
                    bad.append(f)
    if bad:
        print(f"MISMATCH with {args.out}: {bad}", file=sys.stderr)
        return 1
    print(f"{args.out} matches a fresh build bit for bit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
