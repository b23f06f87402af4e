#!/usr/bin/env python3
"""train_tokenizer.py — the demo model's tokenizer: byte-level BPE, Qwen2 style.

    python3 training/train_tokenizer.py --corpus DIR --out DIR [--vocab 8192]

Trains a byte-level BPE with Hugging Face `tokenizers` on DIR/train.txt (or
train.txt.xz) and writes tokenizer.json and tokenizer_config.json to --out.
The pipeline is exactly the one moe.c's converter (tools/hf_tokenizer.c)
maps to its "qwen2" pre-tokenizer, and this script refuses to write
anything else (check_moe_compatible below mirrors the converter's rules):

    normalizer     NFC (what "qwen2" implies)
    pre-tokenizer  Sequence[Split(Qwen2 regex, Isolated), ByteLevel(no regex,
                   no prefix space)]
    model          BPE, no byte_fallback, ignore_merges false, no unk token
    decoder        ByteLevel
    post-processor ByteLevel (adds no tokens)

Ids: the BPE vocabulary first (256 byte symbols, then merges in order), then
the special tokens <|endoftext|>, <|im_start|>, <|im_end|> as the last three
ids, as in Qwen's files. --vocab counts them (8192 = 8189 BPE + 3 special).
tokenizer_config.json: no BOS, EOS <|im_end|> (ends a chat turn), pad
<|endoftext|>, add_bos/add_eos false, a plain ChatML chat template (no
default system message: the model was trained on user/assistant turns).
"""
import argparse
import hashlib
import json
import lzma
import os
import sys

# Qwen2's split regex, character for character as its tokenizer.json has it
# (and as known_pre[] in tools/hf_tokenizer.c spells "qwen2").
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
                 "+ '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                 "{% endif %}")


def read_corpus(corpus_dir, name):
    plain = os.path.join(corpus_dir, name)
    if os.path.exists(plain):
        with open(plain, encoding="utf-8") as f:
            return f.read()
    with lzma.open(plain + ".xz", "rt", encoding="utf-8") as f:
        return f.read()


def check_moe_compatible(tj):
    """The rules tools/hf_tokenizer.c applies to a byte-level BPE, on the
    saved JSON. Raises ValueError naming the first one broken."""
    def need(cond, what):
        if not cond:
            raise ValueError("tokenizer.json would be refused by moe.c: " + what)

    model = tj["model"]
    need(model.get("type") == "BPE", "model is not BPE")
    need(not model.get("byte_fallback"), "byte_fallback is on (would be read as SentencePiece)")
    need(not model.get("ignore_merges"), "ignore_merges is on (qwen2 implies off)")
    need((tj.get("normalizer") or {}).get("type") == "NFC", "normalizer is not NFC (qwen2 implies NFC)")
    pre = tj.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    need(len(steps) == 2, f"pre-tokenizer has {len(steps)} steps, expected Split + ByteLevel")
    split, byte_level = steps
    need(split.get("type") == "Split" and split.get("behavior") == "Isolated" and not split.get("invert"),
         "first step is not an Isolated, non-inverted Split")
    need(split.get("pattern", {}).get("Regex") == QWEN2_REGEX, "Split regex is not Qwen2's")
    need(byte_level.get("type") == "ByteLevel", "second step is not ByteLevel")
    need(byte_level.get("use_regex") is False, "ByteLevel applies its own regex after the Split")
    need(not byte_level.get("add_prefix_space"), "ByteLevel add_prefix_space is on")
    need((tj.get("decoder") or {}).get("type") == "ByteLevel", "decoder is not ByteLevel")
    for i, m in enumerate(model["merges"]):
        left = m[0] if isinstance(m, list) else m.split(" ", 1)[0]
        need(" " not in left[1:], f"merge {i} has a space in its left side")
    ids = {t["content"]: t["id"] for t in tj["added_tokens"]}
    need(all(s in ids for s in SPECIALS), "a special token is missing")


def train(corpus_dir, out_dir, vocab_size):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    text = read_corpus(corpus_dir, "train.txt")
    docs = [d for d in text.split("\n\n") if d]
    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIALS), min_frequency=2, show_progress=False, special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    # Each document with the blank line that follows it in the file, so the
    # separator's tokens are learnt the way the training stream uses them.
    tok.train_from_iterator((d + "\n\n" for d in docs), trainer=trainer, length=len(docs))
    n_bpe = tok.get_vocab_size(with_added_tokens=False)
    tok.add_special_tokens(SPECIALS)
    n = tok.get_vocab_size(with_added_tokens=True)
    if n != vocab_size:
        print(f"train_tokenizer: warning: vocabulary is {n}, not {vocab_size} (corpus too small?)", file=sys.stderr)

    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "tokenizer.json")
    tok.save(path)
    with open(path, encoding="utf-8") as f:
        tj = json.load(f)
    check_moe_compatible(tj)
    ids = {t["content"]: t["id"] for t in tj["added_tokens"]}

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False,
        "add_eos_token": False,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "model_max_length": 512,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(ids[s]): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                          "single_word": False, "special": True} for s in SPECIALS},
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")

    # A round trip on the corpus (byte-level BPE must give the text back),
    # and the numbers the summary reports.
    sample = "\n\n".join(docs[:2000]) + "\n"
    enc = tok.encode(sample)
    assert tok.decode(enc.ids, skip_special_tokens=False) == sample, "decode(encode(text)) != text"
    chat = "<|im_start|>user\nHi<|im_end|>\n"
    chat_ids = tok.encode(chat).ids
    assert chat_ids[0] == ids["<|im_start|>"] and ids["<|im_end|>"] in chat_ids, "special tokens not parsed"
    with open(path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    info = {"vocab_size": n, "bpe_tokens": n_bpe, "merges": len(tj["model"]["merges"]),
            "special_ids": {s: ids[s] for s in SPECIALS},
            "chars_per_token": round(len(sample) / len(enc.ids), 3), "tokenizer_json_sha256": sha}
    print("tokenizer: " + json.dumps(info))
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True, help="folder with train.txt or train.txt.xz")
    ap.add_argument("--out", required=True, help="where tokenizer.json and tokenizer_config.json go")
    ap.add_argument("--vocab", type=int, default=8192, help="vocabulary size, special tokens included")
    args = ap.parse_args()
    train(args.corpus, args.out, args.vocab)


if __name__ == "__main__":
    main()
