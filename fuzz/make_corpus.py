#!/usr/bin/env python3
"""Writes the seed corpora of fuzz/corpus/NAME/: a few small valid inputs per reader, plus the
edge cases its header comment names. Run from anywhere; rewrites the files in place."""
import json
import os
import struct

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(name, file, data):
    with open(os.path.join(HERE, name, file), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors(tensors, metadata=None):
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":"))
    text += " " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text.encode() + b"".join(blobs)


def shard(tokens):
    head = struct.pack("<3i", 20240520, 1, len(tokens)) + bytes(4 * 253)
    return head + struct.pack("<%dH" % len(tokens), *tokens)


def checkpoint(step, params):
    """params: list of (numel, [(offset, numel, step)]); data is m then v per segment."""
    out = b"MWADAMv1" + struct.pack("<qq", step, len(params))
    for numel, segs in params:
        out += struct.pack("<qq", numel, len(segs))
        for s in segs:
            out += struct.pack("<qqq", *s)
    for numel, segs in params:
        for _, n, _ in segs:
            out += struct.pack("<%df" % (2 * n), *([0.5] * n + [0.25] * n))
    return out


put("json", "config", '{"n_layer": 12, "n_embd": 768, "eps": 1e-05, "a": [true, false, null]}')
put("json", "escapes", '["\\u00e9\\ud83d\\ude00\\n\\"", -0.0, 1.5e300, 9007199254740993]')
put("json", "nested", '{"a": {"b": {"c": [[[], {}], ""]}}}')
put("safetensors", "two_f32", safetensors([("w", "F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)),
                                           ("b", "F32", [2], struct.pack("<2f", 5, 6))],
                                          {"format": "pt"}))
put("safetensors", "dtypes", safetensors([("h", "F16", [2], b"\x00\x3c\x00\xc0"),
                                          ("bf", "BF16", [1], b"\x80\x3f"),
                                          ("i", "I32", [], struct.pack("<i", 7)),
                                          ("d", "F64", [1], struct.pack("<d", 2.5))]))
put("safetensors", "empty", safetensors([]))
put("token_shard", "short", shard([50256, 1, 2, 3, 4, 5, 6]))
put("token_shard", "one", shard([65535]))
config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 97,
          "n_positions": 64, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_inner": None,
          "activation_function": "gelu_new", "resid_pdrop": 0.1, "embd_pdrop": 0.1,
          "attn_pdrop": 0.1, "layer_norm_epsilon": 1e-05, "initializer_range": 0.02,
          "scale_attn_weights": True, "use_cache": True, "bos_token_id": 96,
          "eos_token_id": 96, "tie_word_embeddings": True}
# The first byte picks the delimiter (odd: tab); what Python's csv module writes.
put("csv", "python_writer", ',id,text\r\n1,"say ""hi"", then\r\nleave"\r\n2,""\r\n\r\n3,x\r\n')
put("csv", "tsv", '\x01story\tn\nA row\t7\n"quoted\ttab"\t8')
put("gpt2_config", "tiny", json.dumps(config, indent=2))
put("gpt2_config", "minimal", '{"n_layer": 1, "n_head": 1, "n_embd": 8, "vocab_size": 10}')
# The fuzz target's parameters: numel 1030 (two 1024-element slices on disk), 6 and 1.
put("optim_checkpoint", "one_segment_each",
    checkpoint(3, [(1030, [(0, 1030, 3)]), (6, [(0, 6, 3)]), (1, [(0, 1, 3)])]))
put("optim_checkpoint", "slices",
    checkpoint(2, [(1030, [(0, 1024, 2), (1024, 6, 1)]), (6, [(0, 4, 2), (4, 2, 2)]), (1, [])]))
