#!/usr/bin/env python3
"""Writes the seed corpora of fuzz_safetensors, fuzz_tokenizer and
fuzz_chat_template:

    python3 fuzz/make_seeds.py fuzz/corpus

into fuzz/corpus/safetensors, fuzz/corpus/tokenizer and
fuzz/corpus/chat_template (committed; rerun after a change to an input
format or to the templates in tests/data/chat_templates). Small valid
inputs covering the features, and a few malformed ones next to them.
"""
import json
import os
import struct
import sys


def safetensors(header, data=b"", pad=True):
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:  # writers pad the header with spaces to a multiple of 8
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def tensor(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


SIZES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2,
         "I16": 2, "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


ENTRY = b'{"dtype":"U8","shape":[1],"data_offsets":[0,1]}'
DUPLICATE = b'{"a":' + ENTRY + b',"a":' + ENTRY + b"}"


def safetensors_seeds():
    data = bytes(range(40))
    two = {"__metadata__": {"format": "pt"}, "model.embed_tokens.weight": tensor("BF16", [4, 3], 0, 24),
           "model.norm.weight": tensor("F32", [4], 24, 40)}
    every, at = {}, 0
    for name, size in SIZES.items():
        every["t." + name.lower()] = tensor(name, [2], at, at + 2 * size)
        at += 2 * size
    seeds = {
        "two.safetensors": safetensors(two, data),
        "every_dtype.safetensors": safetensors(every, bytes(at)),
        "empty_and_scalar.safetensors": safetensors(
            {"empty": tensor("F16", [0, 8], 2, 2), "scalar": tensor("F32", [], 0, 4),
             "eight_dims": tensor("U8", [1] * 8, 4, 5)}, bytes(5)),
        "no_tensors.safetensors": safetensors({"__metadata__": {}}, pad=False),
        "bad_header_length.safetensors": struct.pack("<Q", 1 << 40) + b"{}",
        "bad_json.safetensors": struct.pack("<Q", 12) + b'{"a":{"dtype',
        "bad_offsets.safetensors": safetensors({"a": tensor("F32", [2], 0, 4)}, bytes(8)),
        "bad_truncated.safetensors": safetensors({"a": tensor("F32", [4], 0, 16)}, bytes(12)),
        "bad_dtype.safetensors": safetensors({"a": tensor("F4", [2], 0, 1)}, bytes(1)),
        "bad_overflow.safetensors": safetensors({"a": tensor("F32", [1 << 32, 1 << 32], 0, 0)}),
        "bad_negative.safetensors": safetensors({"a": tensor("F32", [-1], 0, 0)}),
        "bad_entry.safetensors": safetensors({"a": [1, 2]}),
        "bad_duplicate.safetensors": struct.pack("<Q", len(DUPLICATE)) + DUPLICATE + b"\x01",
        "bad_short.safetensors": b"\x02\x00\x00",
    }
    return seeds


# --- fuzz_tokenizer: the first byte below 0x80 is flags + text ---------------

TEXTS = {
    "ascii": (0, "Hello world, the cat's 12 dogs.\n\n  indented\ttab\r\n"),
    "specials": (7, "<|im_start|>user\nthe caf\u00e9<|im_end|>\n<|im_start|>assistant\n<think>hm</think>ok"),
    "specials_plain": (0, "<|im_start|><|im<|<think><|endoftext|>"),
    "nfc": (5, "cafe\u0301 \u1100\u1161\u11a8 A\u030a \u212b e\u0301<|im_end|>\u0338 >\u0338"),
    "cjk_emoji": (4, "\u4e2d\u6587 \u4e2d\u4e2d \U0001f600\U0001f468\u200d\U0001f469 \u0645\u0631\u062d\u0628\u0627"),
    "numbers": (2, "1234567890 3.14 1,000,000 \u0661\u0662\u0663 \u00bd"),
    "contractions": (0, "I'll we've she'S THEY'RE don't O'NEIL \u017ft"),
    "whitespace": (1, "a  b   c\n \n\t\n\u00a0\u3000x \u2028y   "),
}
INVALID = {
    "invalid": b"\x04" + b"\xff\xfe abc \xc3 \xe2\x82 \xf0\x9f\x98\x80\x80 \xed\xa0\x80 \xc0\xaf tail",
    "invalid_specials": b"\x07\xe4\xb8<|im_end|>\xad e\xcc<think>\x81",
}


def vocab(head, tokens, merges=b"", types=b"", scores=b"", ids=b""):
    """Mode 2 of fuzz_tokenizer (see vocab_writer there)."""
    return b"\x80" + bytes(head) + b"\0".join([b"\n".join(tokens), b"\n".join(merges), types, scores, ids])


def tokenizer_seeds():
    seeds = {name + ".txt": bytes([flags]) + text.encode() for name, (flags, text) in TEXTS.items()}
    seeds.update({name + ".txt": data for name, data in INVALID.items()})
    g = "\u0120".encode()  # GPT-2's space
    # gpt2 + qwen2 with the byte tokens: merged words, specials (parsed), EOS
    # (id 4 of the added tokens) and an unknown token.
    seeds["vocab_gpt2.bin"] = vocab(
        [4 | 8 | 32, 4, 2 | 16, 2 | 16 | 64],
        [g + b"t", b"he", g + b"the", b"<|im_start|>", b"<|im_end|>", b"<think>", b"<unk>"],
        [g + b" t", b"h e", g + b"t he"], bytes([1, 1, 1, 3, 3, 4, 2]), b"", bytes([1, 4, 1, 1, 6]))
    # llama with <0xNN> byte tokens, scores, BOS/EOS/UNK and the dummy prefix,
    # encoded with specials parsed and added.
    m = "\u2581".encode()
    seeds["vocab_llama.bin"] = vocab(
        [1 | 4 | 8 | 16, 0, 1 | 2 | 16, 4 | 32 | 64 | 128],
        [m, b"<unk>", b"<s>", b"</s>", b"a", b"b", b"ab", m + b"a", m + b"ab", m + m],
        b"", bytes([1, 2, 3, 3, 1, 1, 1, 1, 1, 1]), bytes([0xfe, 0x80, 0x80, 0x80, 0xf6, 0xf6, 0xff, 0xfe, 0xfd, 1]),
        bytes([2, 3, 1, 1, 1]))
    # llama-bpe without byte tokens (ignore_merges, BOS by default).
    seeds["vocab_llama3.bin"] = vocab([8 | 32, 5, 1, 0], [b"x", b"y", b"z", b"xy", b"xyz", b"<|eot_id|>"],
                                      [b"x y", b"xy z"], bytes([1, 1, 1, 1, 1, 3]), b"", bytes([5]))
    # Refused: a merge naming no token, a bad type, a NaN score, an id past
    # the end, add_bos_token of the wrong type, an unknown pre-tokenizer.
    seeds["bad_merge.bin"] = vocab([32, 2, 0, 0], [b"a", b"b"], [b"a c"])
    seeds["bad_type.bin"] = vocab([8 | 32, 2, 0, 0], [b"a", b"b"], b"", bytes([1, 9]))
    seeds["bad_score.bin"] = vocab([1 | 16, 0, 0, 0], [b"a", b"b"], b"", b"", bytes([1, 0x7f]))
    seeds["bad_id.bin"] = vocab([32, 2, 2, 0], [b"a", b"b"], b"", b"", b"", bytes([1, 255]))
    seeds["bad_flag.bin"] = vocab([32, 2, 128, 0], [b"a"])
    seeds["bad_pre.bin"] = vocab([32, 8, 0, 0], [b"a"])
    return seeds


# --- fuzz_chat_template: family byte, then NUL-separated source and messages ---

DETECTED, CHATML, QWEN3, LLAMA3, MISTRAL, BY_NAME, NONE, UNKNOWN = range(8)
PROMPT, NO_SOURCE = 8, 16
TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "chat_templates")

# llama.cpp's test conversation, as in tests/test_chat_template.c.
CONVERSATION = [("s", "You are a helpful assistant"), ("u", "Hello"), ("a", "Hi there"), ("u", "Who are you"),
                ("a", "   I am an assistant   "), ("u", "Another question")]
THINKING = [("u", "q1"), ("a", "x<think>a\n</think>b</think>\n\nc"), ("u", "q2"), ("a", "plain"),
            ("a", "<think>t</think>thought"), ("u", "<tool_response>\n42\n</tool_response>"),
            ("a", "<think>\n\nr\n\n</think>\n\ndone")]


def chat(head, source, messages):
    """A role of None is a message without its role byte: no content."""
    fields = [source.encode()] + [(role + content if role else content).encode() for role, content in messages]
    return bytes([head]) + b"\0".join(fields)


def template(name):
    with open(os.path.join(TEMPLATES, name), encoding="utf-8") as f:
        return f.read()


def chat_template_seeds():
    seeds = {}
    for name in sorted(os.listdir(TEMPLATES)):
        seeds[name.replace(".jinja", ".bin")] = chat(DETECTED | PROMPT, template(name), CONVERSATION)
    seeds["qwen3_thinking.bin"] = chat(QWEN3, "", THINKING)
    seeds["qwen3_thinking_prompt.bin"] = chat(QWEN3 | PROMPT, "", THINKING[:3])
    seeds["chatml_by_name.bin"] = chat(BY_NAME | PROMPT, "chatml", CONVERSATION[1:])
    seeds["llama3_unicode.bin"] = chat(LLAMA3 | PROMPT, "llama3", [
        ("u", "\u00a0 \tHi\u3000there \u2029\x1f\r\n"), ("a", "\u200b\u180e x \u0085"), ("s", " \n ")])
    seeds["mistral_by_name.bin"] = chat(BY_NAME, "mistral", CONVERSATION)
    seeds["default_system.bin"] = chat(
        DETECTED, "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
        "{{- '<|im_start|>system\\nYou are Qwen.<|im_end|>\\n' }}<|im_start|>system\nreal<|im_end|>", [("u", "hi")])
    # Refused: roles out of mistral's order, an unknown role, no content, no
    # messages, an unknown name or family, no source; invalid UTF-8.
    seeds["bad_mistral_order.bin"] = chat(MISTRAL, "[INST]", [("u", "a"), ("u", "b")])
    seeds["bad_role.bin"] = chat(CHATML, "", [("u", "a"), ("x", "b")])
    seeds["bad_no_content.bin"] = chat(LLAMA3, "", [("u", "a"), (None, "")])
    seeds["bad_no_messages.bin"] = chat(QWEN3 | PROMPT, "<|im_start|></think>", [])
    seeds["bad_name.bin"] = chat(BY_NAME, "vicuna", [("u", "a")])
    seeds["bad_none.bin"] = chat(NONE | PROMPT, "", [("u", "a")])
    seeds["bad_unknown.bin"] = chat(UNKNOWN, "", [("u", "a")])
    seeds["bad_no_source.bin"] = chat(DETECTED | NO_SOURCE, "<|im_start|>", [("u", "a")])
    seeds["invalid_utf8.bin"] = chat(LLAMA3, "", [("u", "x")]) + b"\xe3\x80 \xc2\xa0\xc0\xa0\xff \xe2\x80\xa8"
    return seeds


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus")
    for target, seeds in (("safetensors", safetensors_seeds()), ("tokenizer", tokenizer_seeds()),
                          ("chat_template", chat_template_seeds())):
        os.makedirs(os.path.join(root, target), exist_ok=True)
        for name, data in seeds.items():
            with open(os.path.join(root, target, name), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main()
