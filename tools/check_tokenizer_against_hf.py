#!/usr/bin/env python3
"""Checks gpt2_tokenize against HuggingFace `tokenizers` with any byte-level BPE files (GPT-2's own
vocab.json/merges.txt, or files learned by --train-bpe): every case of tests/fixtures/bpe/cases.json
(invalid UTF-8 included) and any text files given become one document each; the shards that
gpt2_tokenize writes must hold exactly the reference ids, each document after <|endoftext|>.

Usage: /tmp/tokvenv/bin/python tools/check_tokenizer_against_hf.py --vocab vocab.json \\
           --merges merges.txt [--app build/apps/gpt2_tokenize] [FILE...]
"""
import argparse
import array
import json
import os
import struct
import subprocess
import sys
import tempfile

from tokenizers import Tokenizer, models, pre_tokenizers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_bpe_reference import FIXTURE, reference  # noqa: E402


def read_shard(path):
    data = open(path, "rb").read()
    magic, version, count = struct.unpack("<3i", data[:12])
    assert magic == 20240520 and version == 1, path
    ids = array.array("H")
    ids.frombytes(data[1024:])
    assert len(ids) == count, path
    return list(ids)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", required=True)
    ap.add_argument("--merges", required=True)
    ap.add_argument("--app", default="build/apps/gpt2_tokenize")
    ap.add_argument("files", nargs="*")
    args = ap.parse_args()
    ref = Tokenizer(models.BPE.from_file(args.vocab, args.merges))
    ref.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    eot = ref.token_to_id("<|endoftext|>")
    docs = [(c["name"], bytes.fromhex(c["text_hex"]))
            for c in json.load(open(os.path.join(FIXTURE, "cases.json")))["cases"]]
    docs += [(f, open(f, "rb").read()) for f in args.files]
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i, (_, data) in enumerate(docs):
            paths.append(os.path.join(tmp, "%05d.txt" % i))
            open(paths[-1], "wb").write(data)
        subprocess.run([args.app, "--vocab", args.vocab, "--merges", args.merges, "--out",
                        os.path.join(tmp, "out")] + paths, check=True, stdout=subprocess.DEVNULL)
        got = read_shard(os.path.join(tmp, "out", "train_000000.bin"))
    want = []
    for _, data in docs:
        want += [eot] + reference(ref, data)[1]
    if got == want:
        print("OK: %d documents, %d ids equal to HF tokenizers %s" %
              (len(docs), len(want), __import__("tokenizers").__version__))
        return 0
    i = next(k for k in range(min(len(got), len(want))) if got[k] != want[k])
    print("MISMATCH at id %d of %d/%d: got %s, want %s" % (i, len(got), len(want), got[i:i + 8],
                                                            want[i:i + 8]))
    return 1


if __name__ == "__main__":
    sys.exit(main())
