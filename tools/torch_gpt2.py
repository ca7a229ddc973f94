"""Plain-torch GPT-2, numerically identical to HuggingFace GPT2LMHeadModel, plus file helpers.

This is memwall's *reference* model. It is only a tool for producing test fixtures and benchmark
baselines; the C++ library never depends on Python. HuggingFace `transformers` is not installed on
our machines, so the math of `GPT2LMHeadModel` is written out here in plain torch:

  x   = drop(wte[ids] + wpe[0..T))                                  embd_pdrop
  for each block:                                                   (pre-LayerNorm)
    a   = ln_1(x)
    qkv = a @ c_attn.W + c_attn.b          W [C, 3C]  (HF Conv1D: [in, out], x @ W + b)
    q,k,v split on the last dim, each reshaped to [B, n_head, T, head_dim]
    s   = q @ k^T / sqrt(head_dim); causal mask (future -> finfo.min); softmax; attn_pdrop
    x   = x + drop(merge_heads(s @ v) @ c_proj.W + c_proj.b)        resid_pdrop
    m   = ln_2(x) @ c_fc.W + c_fc.b        W [C, 4C]
    x   = x + drop(gelu_new(m) @ mlp.c_proj.W + mlp.c_proj.b)       W [4C, C]
  logits = ln_f(x) @ wte^T                  LM head tied to wte, no bias
  loss   = mean CE(logits[:, :-1], ids[:, 1:])                      (ColossalAI GPTLMLoss)

gelu_new(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); LayerNorm eps = 1e-5.

Parameter names are exactly HF's (`transformer.h.0.attn.c_attn.weight`, ...); `lm_head.weight` is the
same tensor as `transformer.wte.weight` and is never a separate entry.

HF initialisation: every Linear/Conv1D/Embedding weight ~ N(0, 0.02), biases 0, LayerNorm weight 1 and
bias 0, and then every `c_proj.weight` ~ N(0, 0.02 / sqrt(2 n_layer)). Weights are drawn in
named_parameters() order from torch's global generator, so a fixed torch.manual_seed gives fixed weights
(not the same numbers HF would draw: its module visiting order differs; the distribution is the same).

Also here, because the `safetensors` package is not installed:
  - save_safetensors / load_safetensors: the safetensors format (8-byte little-endian header length,
    JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {str: str}} padded with spaces to a
    multiple of 8, then the raw little-endian tensor bytes with no holes);
  - write_config_json / read_config_json: an HF-style config.json for GPT-2.

Use /usr/bin/python3 (Debian's python3-torch), not the pyenv python on PATH.
"""

import json
import math
import os
import struct
import sys
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F


# ----------------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class GPT2Config:
    """Mirrors HF GPT2Config's fields (the ones that change the math)."""

    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    vocab_size: int = 50257
    n_positions: int = 1024
    layer_norm_epsilon: float = 1e-5
    resid_pdrop: float = 0.1
    embd_pdrop: float = 0.1
    attn_pdrop: float = 0.1
    initializer_range: float = 0.02

    def without_dropout(self):
        return replace(self, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


# HF's four released sizes, and memwall's "tiny" (gpt2::Config::preset, for quick runs). GPT2Config()
# defaults are the small model (124,439,808 parameters).
PRESETS = {
    "tiny": GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=97, n_positions=32),
    "small": GPT2Config(n_layer=12, n_head=12, n_embd=768),
    "medium": GPT2Config(n_layer=24, n_head=16, n_embd=1024),
    "large": GPT2Config(n_layer=36, n_head=20, n_embd=1280),
    "xl": GPT2Config(n_layer=48, n_head=25, n_embd=1600),
}


def expected_numel(cfg):
    """Closed-form parameter count (tied LM head counted once); checks the module against it."""
    C, V, P, L = cfg.n_embd, cfg.vocab_size, cfg.n_positions, cfg.n_layer
    per_block = (2 * C) + (C * 3 * C + 3 * C) + (C * C + C) + (2 * C) + (C * 4 * C + 4 * C) + (4 * C * C + C)
    return V * C + P * C + L * per_block + 2 * C


# ----------------------------------------------------------------------------------------------------
# Model


def gelu_new(x):
    """HF's "gelu_new" (the tanh approximation), written out exactly as HF's NewGELUActivation."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class Conv1D(nn.Module):
    """HF's Conv1D: a linear layer with weight stored [in, out]; y = x @ W + b."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.zeros(out_features))

    def forward(self, x):
        out_shape = x.shape[:-1] + (self.weight.shape[1],)
        y = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)
        return y.view(out_shape)


class Attention(nn.Module):
    # False: HF's eager attention, written out below (the T x T scores are materialised and saved
    # for backward). True: torch's fused F.scaled_dot_product_attention (HF attn_implementation
    # "sdpa"); same function, computed by flash or memory-efficient kernels where torch has them.
    use_sdpa = False

    def __init__(self, cfg):
        super().__init__()
        C = cfg.n_embd
        if C % cfg.n_head != 0:
            raise ValueError(f"n_embd ({C}) must be divisible by n_head ({cfg.n_head})")
        self.n_head = cfg.n_head
        self.head_dim = C // cfg.n_head
        self.c_attn = Conv1D(C, 3 * C)
        self.c_proj = Conv1D(C, C)
        self.attn_dropout = nn.Dropout(cfg.attn_pdrop)
        self.resid_dropout = nn.Dropout(cfg.resid_pdrop)
        P = cfg.n_positions
        # Not a parameter and not saved (HF marks its "bias" buffer persistent=False too).
        self.register_buffer(
            "causal", torch.tril(torch.ones(P, P, dtype=torch.bool)).view(1, 1, P, P), persistent=False
        )

    def _split_heads(self, x):  # [B, T, C] -> [B, H, T, D]
        B, T, _ = x.shape
        return x.view(B, T, self.n_head, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = self._split_heads(q), self._split_heads(k), self._split_heads(v)
        if self.use_sdpa:
            p = self.attn_dropout.p if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
            return self.resid_dropout(self.c_proj(y.permute(0, 2, 1, 3).contiguous().view(B, T, C)))
        scores = torch.matmul(q, k.transpose(-1, -2))  # [B, H, T, T]
        scores = scores / torch.full([], v.size(-1) ** 0.5, dtype=scores.dtype, device=scores.device)
        mask = self.causal[:, :, :T, :T]
        mask_value = torch.full([], torch.finfo(scores.dtype).min, dtype=scores.dtype, device=scores.device)
        scores = torch.where(mask, scores, mask_value)
        probs = F.softmax(scores, dim=-1)
        probs = self.attn_dropout(probs)
        y = torch.matmul(probs, v)  # [B, H, T, D]
        y = y.permute(0, 2, 1, 3).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C = cfg.n_embd
        self.c_fc = Conv1D(C, 4 * C)
        self.c_proj = Conv1D(4 * C, C)
        self.dropout = nn.Dropout(cfg.resid_pdrop)

    def forward(self, x):
        return self.dropout(self.c_proj(gelu_new(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class Transformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.drop = nn.Dropout(cfg.embd_pdrop)
        self.h = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)

    def forward(self, ids):
        T = ids.shape[1]
        pos = torch.arange(T, dtype=torch.long, device=ids.device).unsqueeze(0)
        x = self.drop(self.wte(ids) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        return self.ln_f(x)


class GPT2LMHeadModel(nn.Module):
    """forward(ids [B, T] int64) -> logits [B, T, vocab]; the LM head is wte (tied, no bias)."""

    def __init__(self, cfg, init=True):
        super().__init__()
        self.config = cfg
        self.transformer = Transformer(cfg)
        if init:
            self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        """HF's GPT2PreTrainedModel._init_weights, including the scaled c_proj init."""
        std = self.config.initializer_range
        proj_std = std / math.sqrt(2 * self.config.n_layer)
        ln_names = set()
        for mod_name, mod in self.named_modules():
            if isinstance(mod, nn.LayerNorm):
                ln_names.add(mod_name + ".weight")
                ln_names.add(mod_name + ".bias")
        for name, p in self.named_parameters():
            if name in ln_names:
                p.fill_(1.0 if name.endswith(".weight") else 0.0)
            elif name.endswith(".bias"):
                p.zero_()
            elif name.endswith("c_proj.weight"):
                p.normal_(mean=0.0, std=proj_std)
            else:  # wte, wpe, c_attn, c_fc weights
                p.normal_(mean=0.0, std=std)

    def forward(self, ids):
        x = self.transformer(ids)
        return torch.matmul(x, self.transformer.wte.weight.t())  # tied LM head

    def numel(self):
        return sum(p.numel() for p in self.parameters())


def lm_loss(logits, ids):
    """ColossalAI GPTLMLoss: mean CE of logits[:, :-1] against ids[:, 1:]."""
    shift_logits = logits[:, :-1, :].contiguous()
    shift_labels = ids[:, 1:].contiguous()
    return F.cross_entropy(shift_logits.view(-1, shift_logits.size(-1)), shift_labels.view(-1))


def hf_state_dict(model):
    """Parameters by HF name, in HF order; the tied lm_head.weight is not included."""
    return {name: p for name, p in model.named_parameters()}


def parameter_names(cfg):
    """The HF names of a GPT-2's tensors, in model order (one source of truth for the fixture)."""
    names = ["transformer.wte.weight", "transformer.wpe.weight"]
    for i in range(cfg.n_layer):
        p = f"transformer.h.{i}."
        names += [
            p + "ln_1.weight", p + "ln_1.bias",
            p + "attn.c_attn.weight", p + "attn.c_attn.bias",
            p + "attn.c_proj.weight", p + "attn.c_proj.bias",
            p + "ln_2.weight", p + "ln_2.bias",
            p + "mlp.c_fc.weight", p + "mlp.c_fc.bias",
            p + "mlp.c_proj.weight", p + "mlp.c_proj.bias",
        ]  # fmt: skip
    names += ["transformer.ln_f.weight", "transformer.ln_f.bias"]
    return names


def load_hf_state_dict(model, tensors):
    """Copies HF-named tensors into model (an `lm_head.weight` entry, if any, must equal wte)."""
    params = hf_state_dict(model)
    missing = [n for n in params if n not in tensors]
    if missing:
        raise KeyError(f"weights file lacks {len(missing)} tensors, first: {missing[:3]}")
    with torch.no_grad():
        for name, p in params.items():
            t = tensors[name]
            if tuple(t.shape) != tuple(p.shape):
                raise ValueError(f"{name}: expected shape {tuple(p.shape)}, found {tuple(t.shape)}")
            p.copy_(t)


# ----------------------------------------------------------------------------------------------------
# safetensors (pure Python)

_DTYPE_TO_ST = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
_ST_TO_DTYPE = {v: k for k, v in _DTYPE_TO_ST.items()}

if sys.byteorder != "little":
    raise RuntimeError("safetensors data is little-endian; this writer assumes a little-endian host")


def _tensor_bytes(t):
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:  # numpy has no bf16; same bits as int16
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def save_safetensors(path, tensors, metadata=None):
    """Writes {name: tensor} to `path` in the safetensors format.

    Tensors are laid out by element size, largest first, then by name (as the official library
    does), so every tensor's data offset is a multiple of its element size and an mmap of the file
    gives aligned views. metadata is a {str: str} dict stored under "__metadata__".
    """
    items = []
    for name, t in tensors.items():
        if t.dtype not in _DTYPE_TO_ST:
            raise TypeError(f"{name}: dtype {t.dtype} has no safetensors code")
        items.append((name, t))
    items.sort(key=lambda it: (-it[1].element_size(), it[0]))
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs, offset = [], 0
    for name, t in items:
        b = _tensor_bytes(t)
        header[name] = {
            "dtype": _DTYPE_TO_ST[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(b)],
        }
        blobs.append(b)
        offset += len(b)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((-len(hjson)) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def load_safetensors(path):
    """Reads a safetensors file; returns ({name: tensor}, metadata dict). Checks offsets for holes."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: {len(data)} bytes, too short for a safetensors header")
    (hlen,) = struct.unpack("<Q", data[:8])
    if 8 + hlen > len(data):
        raise ValueError(f"{path}: header length {hlen} runs past the file end ({len(data)} bytes)")
    header = json.loads(data[8 : 8 + hlen].decode("utf-8"))
    metadata = header.pop("__metadata__", {}) or {}
    body = memoryview(data)[8 + hlen :]
    out, spans = {}, []
    for name, info in header.items():
        dtype = _ST_TO_DTYPE[info["dtype"]]
        begin, end = info["data_offsets"]
        shape = info["shape"]
        numel = math.prod(shape)
        esize = torch.empty([], dtype=dtype).element_size()
        if end - begin != numel * esize or end > len(body):
            raise ValueError(f"{path}: tensor {name} has offsets [{begin},{end}) for {numel} x {esize} B")
        raw = bytearray(body[begin:end])
        if dtype == torch.bfloat16:
            t = torch.frombuffer(raw, dtype=torch.int16).view(torch.bfloat16) if numel else torch.empty(0, dtype=dtype)
        else:
            t = torch.frombuffer(raw, dtype=dtype) if numel else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(shape)
        spans.append((begin, end))
    spans.sort()
    pos = 0
    for begin, end in spans:
        if begin != pos:
            raise ValueError(f"{path}: data buffer has a hole or overlap at byte {pos}")
        pos = end
    if pos != len(body):
        raise ValueError(f"{path}: {len(body) - pos} trailing bytes after the last tensor")
    return out, metadata


# ----------------------------------------------------------------------------------------------------
# config.json


def config_to_hf_dict(cfg):
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "activation_function": "gelu_new",
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_embd": cfg.n_embd,
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.n_positions,
        "n_ctx": cfg.n_positions,
        "layer_norm_epsilon": cfg.layer_norm_epsilon,
        "resid_pdrop": cfg.resid_pdrop,
        "embd_pdrop": cfg.embd_pdrop,
        "attn_pdrop": cfg.attn_pdrop,
        "initializer_range": cfg.initializer_range,
        "tie_word_embeddings": True,
    }


def write_config_json(path, cfg):
    with open(path, "w") as f:
        json.dump(config_to_hf_dict(cfg), f, indent=2, sort_keys=True)
        f.write("\n")


def read_config_json(path):
    with open(path) as f:
        d = json.load(f)
    fields = set(asdict(GPT2Config()).keys())
    return GPT2Config(**{k: v for k, v in d.items() if k in fields})
