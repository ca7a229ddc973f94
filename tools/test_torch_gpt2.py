#!/usr/bin/python3
"""Tests for tools/torch_gpt2.py and the committed gpt2_tiny fixture.

    /usr/bin/python3 -m unittest discover -s tools -p 'test_*.py' -v

What they prove:
  - the model matches a second, independently written, loop-per-head GPT-2 in float64 (catches
    reshape/permute/mask/scaling mistakes in the vectorised model), and the LM head is tied to wte;
  - causality: changing token t changes no logits before t;
  - HF initialisation statistics (0.02, scaled c_proj, LN 1/0, biases 0) and the parameter counts of
    the four presets (HF's published 124,439,808 / 354,823,168 / 774,030,080 / 1,557,611,200);
  - the safetensors writer/reader round-trips every dtype, pads the header to 8 bytes, leaves no holes,
    and keeps every tensor aligned to its element size;
  - the committed fixture loads, and re-running its weights through the model reproduces its loss,
    logits and gradients exactly, and the fixture regenerates bit for bit.
"""

import json
import math
import os
import struct
import sys
import tempfile
import unittest

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_gpt2_reference as mkref  # noqa: E402
import torch_gpt2 as tg  # noqa: E402

FIXTURE = os.path.join(os.path.dirname(HERE), "tests", "fixtures", "gpt2_tiny")
TINY = tg.GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=97, n_positions=32).without_dropout()


def naive_gpt2_logits(params, cfg, ids):
    """GPT-2 written with explicit loops over batch and head, from HF-named f64 tensors."""
    B, T = ids.shape
    C, H = cfg.n_embd, cfg.n_head
    D = C // H
    eps = cfg.layer_norm_epsilon

    def ln(x, w, b):
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)  # biased variance, as LayerNorm
        return (x - mu) / torch.sqrt(var + eps) * w + b

    def gelu(x):
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))

    p = params
    x = p["transformer.wte.weight"][ids] + p["transformer.wpe.weight"][:T].unsqueeze(0)
    for i in range(cfg.n_layer):
        pre = f"transformer.h.{i}."
        a = ln(x, p[pre + "ln_1.weight"], p[pre + "ln_1.bias"])
        qkv = a @ p[pre + "attn.c_attn.weight"] + p[pre + "attn.c_attn.bias"]
        y = torch.zeros(B, T, C, dtype=x.dtype)
        for b in range(B):
            for h in range(H):
                q = qkv[b, :, h * D : (h + 1) * D]
                k = qkv[b, :, C + h * D : C + (h + 1) * D]
                v = qkv[b, :, 2 * C + h * D : 2 * C + (h + 1) * D]
                for t in range(T):
                    s = (k[: t + 1] @ q[t]) / math.sqrt(D)  # only keys 0..t are visible
                    w = torch.exp(s - s.max())
                    w = w / w.sum()
                    y[b, t, h * D : (h + 1) * D] = w @ v[: t + 1]
        x = x + y @ p[pre + "attn.c_proj.weight"] + p[pre + "attn.c_proj.bias"]
        m = ln(x, p[pre + "ln_2.weight"], p[pre + "ln_2.bias"])
        m = gelu(m @ p[pre + "mlp.c_fc.weight"] + p[pre + "mlp.c_fc.bias"])
        x = x + m @ p[pre + "mlp.c_proj.weight"] + p[pre + "mlp.c_proj.bias"]
    x = ln(x, p["transformer.ln_f.weight"], p["transformer.ln_f.bias"])
    return x @ p["transformer.wte.weight"].t()


def first_mismatches(a, b, tol, n=5):
    diff = (a - b).abs().flatten()
    idx = torch.nonzero(diff > tol).flatten()[:n].tolist()
    return (
        f"max |diff| {diff.max().item():.3e}; first mismatches (flat index, a, b): "
        + ", ".join(f"({i}, {a.flatten()[i].item():.9g}, {b.flatten()[i].item():.9g})" for i in idx)
    )


class ModelMath(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        # Non-trivial LN/bias values so that a wrong bias or LN affine would show.
        self.model = tg.GPT2LMHeadModel(TINY).double()
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                if "ln_" in n or n.endswith(".bias"):
                    p.add_(0.1 * torch.randn_like(p))
        self.ids = torch.randint(0, TINY.vocab_size, (2, 11))

    def test_matches_naive_loop_implementation(self):
        got = self.model(self.ids).detach()
        params = {n: p.detach() for n, p in tg.hf_state_dict(self.model).items()}
        want = naive_gpt2_logits(params, TINY, self.ids)
        # Both in f64 with different summation orders; 1e-10 is ~1e6 ulps of headroom on logits ~1.
        self.assertTrue(torch.allclose(got, want, rtol=0, atol=1e-10), first_mismatches(got, want, 1e-10))

    def test_causal(self):
        base = self.model(self.ids).detach()
        ids2 = self.ids.clone()
        ids2[:, 6] = (ids2[:, 6] + 1) % TINY.vocab_size
        changed = self.model(ids2).detach()
        # Positions before 6 must be bitwise unchanged (the same arithmetic on the same inputs).
        self.assertTrue(torch.equal(base[:, :6], changed[:, :6]))
        self.assertGreater((base[:, 6:] - changed[:, 6:]).abs().max().item(), 1e-6)

    def test_loss_is_shifted_mean_ce(self):
        logits = self.model(self.ids)
        loss = tg.lm_loss(logits, self.ids).item()
        logp = torch.log_softmax(logits.detach(), -1)
        B, T = self.ids.shape
        manual = -sum(logp[b, t, self.ids[b, t + 1]].item() for b in range(B) for t in range(T - 1)) / (
            B * (T - 1)
        )
        self.assertAlmostEqual(loss, manual, delta=1e-12)  # f64; both sum ~20 terms of size ~5

    def test_lm_head_is_tied_and_its_grad_counted(self):
        names = [n for n, _ in self.model.named_parameters()]
        self.assertEqual(names, tg.parameter_names(TINY))
        self.assertNotIn("lm_head.weight", names)
        tg.lm_loss(self.model(self.ids), self.ids).backward()
        tied_grad = self.model.transformer.wte.weight.grad.clone()
        # Untied: the embedding lookup and the head see separate copies; their grads must sum to the tied one.
        params = {n: p.detach().clone().requires_grad_(True) for n, p in tg.hf_state_dict(self.model).items()}
        head = params["transformer.wte.weight"].detach().clone().requires_grad_(True)
        x = params["transformer.wte.weight"][self.ids]
        hidden_model = self.model.transformer
        h = x + hidden_model.wpe.weight[: self.ids.shape[1]]
        for blk in hidden_model.h:
            h = blk(h)
        h = hidden_model.ln_f(h)
        tg.lm_loss(h @ head.t(), self.ids).backward()
        untied = params["transformer.wte.weight"].grad + head.grad
        self.assertTrue(torch.allclose(tied_grad, untied, rtol=0, atol=1e-14), first_mismatches(tied_grad, untied, 1e-14))


class Init(unittest.TestCase):
    def test_preset_sizes(self):
        want = {"small": 124_439_808, "medium": 354_823_168, "large": 774_030_080, "xl": 1_557_611_200}
        for name, n in want.items():
            self.assertEqual(tg.expected_numel(tg.PRESETS[name]), n, name)
        model = tg.GPT2LMHeadModel(tg.PRESETS["small"], init=False)
        self.assertEqual(model.numel(), 124_439_808)

    def test_hf_init_statistics(self):
        torch.manual_seed(0)
        cfg = tg.GPT2Config(n_layer=8, n_head=4, n_embd=128, vocab_size=1000, n_positions=64)
        model = tg.GPT2LMHeadModel(cfg)
        proj_std = 0.02 / math.sqrt(2 * cfg.n_layer)
        for n, p in model.named_parameters():
            if ".ln_" in n or "ln_f" in n:
                want = 1.0 if n.endswith("weight") else 0.0
                self.assertTrue(torch.all(p == want), n)
            elif n.endswith(".bias"):
                self.assertTrue(torch.all(p == 0), n)
            else:
                std = proj_std if n.endswith("c_proj.weight") else 0.02
                # >= 16K samples each: the sample std is within ~1% (3 sigma) of the true one; allow 5%.
                self.assertLess(abs(p.std().item() / std - 1), 0.05, f"{n}: std {p.std().item():.5f} vs {std:.5f}")
                self.assertLess(abs(p.mean().item()), 5 * std / math.sqrt(p.numel()) + 1e-7, n)


class SafeTensors(unittest.TestCase):
    def test_round_trip_all_dtypes(self):
        tensors = {
            "f64": torch.randn(3, 5, dtype=torch.float64),
            "f32": torch.randn(7, dtype=torch.float32),
            "f16": torch.randn(2, 3).half(),
            "bf16": torch.randn(5).bfloat16(),
            "i64": torch.arange(-3, 4, dtype=torch.int64),
            "i32": torch.arange(3, dtype=torch.int32).reshape(1, 3),
            "u8": torch.arange(3, dtype=torch.uint8),
            "scalar": torch.tensor(2.5),
            "empty": torch.zeros(0, 4),
            "strided": torch.randn(4, 6)[:, ::2],
        }
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "x.safetensors")
            tg.save_safetensors(path, tensors, {"k": 1})
            back, meta = tg.load_safetensors(path)
            with open(path, "rb") as f:
                raw = f.read()
        self.assertEqual(meta, {"k": "1"})
        self.assertEqual(set(back), set(tensors))
        for n, t in tensors.items():
            self.assertEqual(back[n].dtype, t.dtype, n)
            self.assertEqual(tuple(back[n].shape), tuple(t.shape), n)
            self.assertTrue(torch.equal(back[n], t), n)
        (hlen,) = struct.unpack("<Q", raw[:8])
        self.assertEqual(hlen % 8, 0)
        header = json.loads(raw[8 : 8 + hlen])
        for n, info in header.items():
            if n == "__metadata__":
                continue
            esize = tensors[n].element_size()
            self.assertEqual(info["data_offsets"][0] % esize, 0, f"{n} misaligned")

    def test_reader_rejects_truncation(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "x.safetensors")
            tg.save_safetensors(path, {"a": torch.randn(10)})
            with open(path, "rb") as f:
                raw = f.read()
            with open(path, "wb") as f:
                f.write(raw[:-4])
            with self.assertRaises(ValueError):
                tg.load_safetensors(path)


class Fixture(unittest.TestCase):
    def test_fixture_reproduces(self):
        cfg = tg.read_config_json(os.path.join(FIXTURE, "config.json"))
        self.assertEqual(cfg, TINY)
        weights, wmeta = tg.load_safetensors(os.path.join(FIXTURE, "model.safetensors"))
        ref, meta = tg.load_safetensors(os.path.join(FIXTURE, "reference.safetensors"))
        self.assertEqual(sorted(weights), sorted(tg.parameter_names(cfg)))
        self.assertEqual(meta["adamw_weight_decay"], "0.1")
        self.assertEqual(tuple(ref["tokens"].shape), (2, 16))
        self.assertEqual(ref["adamw_losses"].shape[0], 10)
        for n, w in weights.items():
            self.assertEqual(w.dtype, torch.float32)
            for prefix in ("grad.", "f64.grad.", "adamw_final."):
                self.assertEqual(ref[prefix + n].shape, w.shape, prefix + n)
        torch.set_num_threads(1)  # the fixture was made single-threaded; same thread count -> same bits
        model = tg.GPT2LMHeadModel(cfg, init=False)
        tg.load_hf_state_dict(model, weights)
        tokens = ref["tokens"]
        logits = model(tokens)
        loss = tg.lm_loss(logits, tokens)
        loss.backward()
        self.assertTrue(torch.equal(logits.detach(), ref["logits"]), first_mismatches(logits.detach(), ref["logits"], 0))
        self.assertEqual(loss.item(), ref["loss"].item())
        for n, p in tg.hf_state_dict(model).items():
            self.assertTrue(torch.equal(p.grad, ref["grad." + n]), n)
        # The losses must fall under AdamW on a fixed batch, and the f64 run agrees with f32 closely.
        self.assertLess(ref["adamw_losses"][-1].item(), ref["adamw_losses"][0].item() - 0.3)
        self.assertEqual(ref["adamw_losses"][0].item(), ref["loss"].item())
        # f32 vs f64 forward of a 2-layer model: relative error ~1e-7 per op, a few ops deep -> 1e-5.
        self.assertLess(abs(ref["loss"].double().item() - ref["f64.loss"].item()), 1e-5)

    def test_regenerates_bit_for_bit(self):
        weights, ref, meta = mkref.build()
        with tempfile.TemporaryDirectory() as d:
            mkref.write(d, weights, ref, meta)
            for f in ("config.json", "model.safetensors", "reference.safetensors"):
                with open(os.path.join(d, f), "rb") as a, open(os.path.join(FIXTURE, f), "rb") as b:
                    self.assertEqual(a.read(), b.read(), f"{f} differs from a fresh build")


if __name__ == "__main__":
    unittest.main()
