#!/usr/bin/env python3
"""Writes the byte-level BPE fixture tests/fixtures/bpe/ with HuggingFace `tokenizers` as the
independent reference (memwall's C++ tokenizer is checked against it; nothing here uses memwall).

  vocab.json, merges.txt   a GPT-2-style byte-level BPE (vocab 600) trained by tokenizers'
                           BpeTrainer on train.txt (committed), all 256 byte tokens included and
                           "<|endoftext|>" last
  tokenizer.json           the same tokenizer in HF's single-file format
  cases.json               [{name, text_hex, pieces_hex, ids}]: a varied corpus and a seeded random
                           one, the reference pre-tokenizer's pieces and the reference ids

The reference is Tokenizer(BPE(vocab, merges)) with pre_tokenizer ByteLevel(add_prefix_space=False,
use_regex=True): GPT-2's regex. Text with invalid UTF-8 cannot enter `tokenizers` (Rust strings), so
for it each invalid byte is replaced by U+FFFD (class Other, like an invalid byte in memwall: see
Note [Pre-tokenizer classes]) to find the pieces, and each piece's original bytes are then encoded by
the reference BPE model itself (model.tokenize on their byte characters). For valid text that path
is checked against tokenizer.encode() before anything is written.

Usage: python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers
       /tmp/tokvenv/bin/python tools/make_bpe_reference.py          (tokenizers 0.23.3 was used)
"""
import codecs
import json
import os
import random

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "tests", "fixtures", "bpe")
VOCAB_SIZE = 600
EOT = "<|endoftext|>"


def one_byte_replace(err):
    return ("\ufffd", err.start + 1)  # one U+FFFD per invalid byte, resume at the next byte


codecs.register_error("one_byte_replace", one_byte_replace)


def train():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    tok.train([os.path.join(FIXTURE, "train.txt")], trainer)
    tok.add_special_tokens([EOT])
    return tok


def reference(tok, data):
    """(pieces, ids) of the bytes `data`."""
    text = data.decode("utf-8", errors="one_byte_replace")
    # Original bytes of each character of `text`, and its length in UTF-8 bytes.
    spans, pos = [], 0
    for ch in text:
        n = len(ch.encode("utf-8"))
        if ch == "\ufffd" and data[pos:pos + 3] != b"\xef\xbf\xbd":
            n_orig = 1
        else:
            n_orig = n
        spans.append((data[pos:pos + n_orig], n))
        pos += n_orig
    assert pos == len(data)
    byte_chars = pre_tokenizers.ByteLevel.alphabet()  # only for the assertion below
    pieces, ids, i = [], [], 0
    for mapped, _ in tok.pre_tokenizer.pre_tokenize_str(text):
        want, got = len(mapped), 0  # mapped has one byte character per UTF-8 byte of the piece
        original = b""
        while got < want:
            original += spans[i][0]
            got += spans[i][1]
            i += 1
        assert got == want
        pieces.append(original)
        chars = "".join(BYTE_TO_CHAR[b] for b in original)
        assert all(c in byte_chars for c in chars)
        ids += [t.id for t in tok.model.tokenize(chars)]
    assert i == len(spans)
    if b"".join(pieces) == data and "\ufffd" not in text:
        assert ids == tok.encode(text).ids, "piece-wise path differs from encode()"
    return pieces, ids


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE_TO_CHAR = bytes_to_unicode()

CASES = [
    ("english", "Hello world! The quick brown fox jumps over the lazy dog."),
    ("contractions", "it's we're they've I'm you'll he'd she'd don't 'tis 'S"),
    ("uppercase_contractions", "DON'T IT'S WE'RE THEY'VE I'M YOU'LL HE'D"),
    ("apostrophes", "rock 'n' roll, '' ''' 'x 'sx 'llama 'reef 'vex' '"),
    ("numbers", "1859 1,250 3.14159 -17 +23 1e-5 0x7F 1234567890 ٣٤٥ ² ½ Ⅻ"),
    ("punctuation_runs", "... !!! ??? --- *** ((( ))) [[ ]] {{ }} <<< >>> :-) ;-( a...b"),
    ("spaces", "a  b   c    d"),
    ("trailing_spaces", "trailing   "),
    ("trailing_newlines", "line\n\n\n"),
    ("leading_whitespace", "   leading and \t\ttabs\tand\n\n\nnewlines\r\nCRLF"),
    ("whitespace_only", " \t\n \n\t "),
    ("single_space", " "),
    ("space_before_punct", "a , b ! c ?"),
    ("unicode_spaces", "a\u00a0b\u3000c\u2028d\u0085e\u2009f \u00a0 g"),
    ("info_separators", "a\x1cb\x1dc\x1ed\x1ff x \x1c\x1cy \x1f"),
    ("control_chars", "a\x00b\x07c\x1bd\x7fe"),
    ("french", "l'été dernier, nous sommes allés à la plage où l'eau était très froide."),
    ("german", "Die Straße war naß, und über den Bäumen hörte man Vögel."),
    ("russian", "Съешь же ещё этих мягких французских булок, да выпей чаю."),
    ("greek", "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία."),
    ("chinese", "我能吞下玻璃而不伤身体。今天天气很好！"),
    ("japanese", "私はガラスを食べられます。カタカナ ひらがな"),
    ("korean", "나는 유리를 먹을 수 있어요."),
    ("arabic", "أنا قادر على أكل الزجاج و هذا لا يؤلمني."),
    ("hindi", "मैं काँच खा सकता हूँ और मुझे उससे कोई चोट नहीं पहुंचती।"),
    ("thai", "ฉันกินกระจกได้ แต่มันไม่ทำให้ฉันเจ็บ"),
    ("combining_marks", "e\u0301 a\u0308 n\u0303 cafe\u0301 \u0301\u0301 x\u0327\u0301y"),
    ("emoji", "😀 👍🏽 ❤️ 🇫🇷 👩‍💻 🎉🎉🎉 🚀✨ a😀b"),
    ("symbols", "© ® ™ € £ ¥ § ¶ ° ± × ÷ → ⇒ ∀ ∃ ∑ √ ∞ ≈ ≠ ≤ ≥"),
    ("code", "def f(x):\n    return x**2  # square\n\tif x != 0:\n\t\tpass\n"),
    ("endoftext_literal", "end<|endoftext|>start"),
    ("mixed_scripts", "abcабвαβγ中文123٣٤abc"),
    ("long_run", "=" * 3000 + " " + "ab" * 500),
]

BYTE_CASES = [
    ("invalid_lone_bytes", b"a\xffb\xfe\x80c"),
    ("invalid_truncated", b"caf\xc3 \xe2\x82 end\xf0\x9f\x98"),
    ("invalid_overlong_surrogate", b"x\xc0\xafy\xed\xa0\x80z\xf4\x90\x80\x80w\xe0\x80\xaf"),
    ("invalid_between_letters", b"abc\x80def \xa0ghi\xc3\xa9\xc3"),
    ("invalid_only", bytes(range(0x80, 0x100))),
    ("all_bytes", bytes(range(256))),
]


def random_text(seed, n_items):
    rng = random.Random(seed)
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " ", "  ", "\t",
        "\n", "\r\n", "'", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", ".,;:!?-_()[]{}\"/\\",
        "éèêëàâäôöûüçñßøå", "\u0301\u0308\u0327", "абвгдежзийклмнопрстуфхцчшщъыьэюяЁ",
        "αβγδεζηθικλμνξοπρστυφχψω", "中文字我你他的是了在有人", "ひらがなカタカナ", "अआइकखगम\u093e\u093f\u094d",
        "٠١٢٣٤٥٦٧٨٩", "²³½¼ⅫⅧ", "😀👍🏽❤🇫🇷🚀✨\u200d\ufe0f", "\u00a0\u3000\u2028\u0085\u2009",
        "©®™€£¥§°±×÷→∞≈",
    ]
    parts = []
    for _ in range(n_items):
        pool = rng.choice(pools)
        if len(pool) <= 3 and pool.strip(" \t\n\r") != pool:  # whitespace items: as they are
            parts.append(pool * rng.randint(1, 3))
            continue
        if pool.startswith("'") and len(pool) <= 3:
            parts.append(pool)
            continue
        parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 8))))
    data = "".join(parts).encode("utf-8")
    # A few invalid bytes spliced in at random places.
    out = bytearray(data)
    for _ in range(n_items // 50):
        out.insert(rng.randrange(len(out) + 1), rng.choice([0x80, 0xbf, 0xc3, 0xe2, 0xf0, 0xff]))
    return bytes(out)


def main():
    tok = train()
    model = json.loads(tok.to_str())
    vocab = model["model"]["vocab"]
    vocab[EOT] = len(vocab)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["model"]["merges"]]
    with open(os.path.join(FIXTURE, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(FIXTURE, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(m + "\n" for m in merges))
    tok.save(os.path.join(FIXTURE, "tokenizer.json"))

    # The reference from the written files, exactly as a user would load them.
    ref = Tokenizer(models.BPE.from_file(os.path.join(FIXTURE, "vocab.json"),
                                         os.path.join(FIXTURE, "merges.txt")))
    ref.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    cases = [(name, text.encode("utf-8")) for name, text in CASES] + BYTE_CASES
    with open(os.path.join(FIXTURE, "train.txt"), "rb") as f:
        cases.append(("train_txt", f.read()))
    cases.append(("random_seed_1", random_text(1, 1500)))
    cases.append(("random_seed_2", random_text(2, 1500)))
    out = []
    for name, data in cases:
        pieces, ids = reference(ref, data)
        out.append({"name": name, "text_hex": data.hex(),
                    "pieces_hex": [p.hex() for p in pieces], "ids": ids})
    with open(os.path.join(FIXTURE, "cases.json"), "w") as f:
        # One case per line, so a diff shows which cases changed.
        f.write('{"reference": %s, "eot_id": %d, "cases": [\n' % (
            json.dumps("HuggingFace tokenizers " + __import__("tokenizers").__version__),
            vocab[EOT]))
        f.write(",\n".join(json.dumps(c, separators=(",", ":")) for c in out) + "\n]}\n")
    print("wrote %s: vocab %d, merges %d, %d cases" % (FIXTURE, len(vocab), len(merges), len(out)))


if __name__ == "__main__":
    main()
