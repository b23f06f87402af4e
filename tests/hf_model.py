#!/usr/bin/env python3
"""Write a tiny Hugging Face checkpoint directory with random weights.

Standard library only, so the converter's tests run where torch is absent:
config.json, safetensors weights (f32, f16 or bf16; one file or shards with
an index; experts per expert or fused as Transformers 5 keeps them),
tokenizer.json (byte-level BPE over the 256 bytes plus three specials) and
tokenizer_config.json with a ChatML template.

Every weight is drawn from a generator seeded by its logical name ("L0.q",
"L1.e3.gate"), not by its checkpoint name, so the same seed gives the same
numbers to the same weight whatever the architecture or layout: a llama
checkpoint and a qwen2 one with zero biases hold one model, which is how
the tests check the llama q/k reordering without Transformers.

usage: hf_model.py ARCH OUT_DIR [options]    (see --help)
"""
import argparse
import json
import math
import os
import random
import struct

ARCHS = {
    # name: (HF class, model_type, MoE flavour or None, q/k norm, q/k/v biases)
    "llama": ("LlamaForCausalLM", "llama", None, None, False),
    "mistral": ("MistralForCausalLM", "mistral", None, None, False),
    "mixtral": ("MixtralForCausalLM", "mixtral", "mixtral", None, False),
    "qwen2": ("Qwen2ForCausalLM", "qwen2", None, None, True),
    "qwen2moe": ("Qwen2MoeForCausalLM", "qwen2_moe", "qwen", None, True),
    "qwen3": ("Qwen3ForCausalLM", "qwen3", None, "head", False),
    "qwen3moe": ("Qwen3MoeForCausalLM", "qwen3_moe", "qwen", "head", False),
    "olmoe": ("OlmoeForCausalLM", "olmoe", "olmoe", "full", False),
}

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


# ---------------------------------------------------------------- numbers

def bf16_bits(x):
    """Round a float to bfloat16 (nearest even) and return its 16 bits."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    return (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16


def rounded(values, dtype):
    """The values as the dtype would store them, back as floats."""
    if dtype == "f16":
        return [struct.unpack("<e", struct.pack("<e", v))[0] for v in values]
    return [struct.unpack("<f", struct.pack("<I", bf16_bits(v) << 16))[0] for v in values]


def encode(values, dtype):
    if dtype == "f32":
        return struct.pack("<%df" % len(values), *values)
    if dtype == "f16":
        return struct.pack("<%de" % len(values), *values)
    return struct.pack("<%dH" % len(values), *[bf16_bits(v) for v in values])


class Weights:
    """Logical weights: name -> (shape, values), each from its own seeded stream."""

    def __init__(self, seed, zero_bias):
        self.seed, self.zero_bias = seed, zero_bias

    def draw(self, logical, shape, kind):
        rng = random.Random("%d:%s" % (self.seed, logical))
        n = math.prod(shape)
        if kind == "norm":
            return [1.0 + 0.2 * rng.gauss(0, 1) for _ in range(n)]
        if kind == "bias":
            return [0.0 if self.zero_bias else 0.2 * rng.gauss(0, 1) for _ in range(n)]
        std = {"embed": 1.0, "router": 0.5}.get(kind, 1.0 / math.sqrt(shape[-1]))
        return [rng.gauss(0, std) for _ in range(n)]


# ---------------------------------------------------------------- the model

def layer_tensors(a, w, l, arch):
    """(checkpoint name, shape, values) of layer l."""
    _, _, moe, qk_norm, bias = ARCHS[arch]
    h, hd = a.hidden, a.head_dim
    q, kv = a.heads * hd, a.kv_heads * hd
    pre = "model.layers.%d." % l
    out = [(pre + "input_layernorm.weight", [h], w.draw("L%d.attn_norm" % l, [h], "norm")),
           (pre + "post_attention_layernorm.weight", [h], w.draw("L%d.ffn_norm" % l, [h], "norm"))]
    for proj, rows, cols in (("q", q, h), ("k", kv, h), ("v", kv, h), ("o", h, q)):
        out.append((pre + "self_attn.%s_proj.weight" % proj, [rows, cols], w.draw("L%d.%s" % (l, proj), [rows, cols], "w")))
        if bias and proj != "o":
            out.append((pre + "self_attn.%s_proj.bias" % proj, [rows], w.draw("L%d.%s_bias" % (l, proj), [rows], "bias")))
    if qk_norm:
        for proj, full in (("q", q), ("k", kv)):
            n = full if qk_norm == "full" else hd
            out.append((pre + "self_attn.%s_norm.weight" % proj, [n], w.draw("L%d.%s_norm" % (l, proj), [n], "norm")))
    if moe is None:
        for proj, rows, cols in (("gate", a.ff, h), ("up", a.ff, h), ("down", h, a.ff)):
            out.append((pre + "mlp.%s_proj.weight" % proj, [rows, cols], w.draw("L%d.%s" % (l, proj), [rows, cols], "w")))
        return out
    return out + moe_tensors(a, w, l, moe, pre)


def moe_tensors(a, w, l, moe, pre):
    h, f, n = a.hidden, a.expert_ff, a.experts
    block = pre + ("block_sparse_moe." if moe == "mixtral" and not a.fused else "mlp.")
    names = ("w1", "w3", "w2") if moe == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    out = [(block + "gate.weight", [n, h], w.draw("L%d.router" % l, [n, h], "router"))]
    experts = [[w.draw("L%d.e%d.%s" % (l, e, role), shape, "w") for role, shape in
                (("gate", [f, h]), ("up", [f, h]), ("down", [h, f]))] for e in range(n)]
    if a.fused:
        out.append((block + "experts.gate_up_proj", [n, 2 * f, h], [v for g, u, _ in experts for v in g + u]))
        out.append((block + "experts.down_proj", [n, h, f], [v for _, _, d in experts for v in d]))
    else:
        for e, (g, u, d) in enumerate(experts):
            for name, shape, values in ((names[0], [f, h], g), (names[1], [f, h], u), (names[2], [h, f], d)):
                out.append((block + "experts.%d.%s.weight" % (e, name), shape, values))
    if a.shared_ff:
        s = a.shared_ff
        for proj, rows, cols in (("gate", s, h), ("up", s, h), ("down", h, s)):
            out.append((block + "shared_expert.%s_proj.weight" % proj, [rows, cols],
                        w.draw("L%d.shared.%s" % (l, proj), [rows, cols], "w")))
        out.append((block + "shared_expert_gate.weight", [1, h], w.draw("L%d.shared.gate_inp" % l, [1, h], "w")))
    return out


def all_tensors(a, arch):
    w = Weights(a.seed, a.zero_bias)
    out = [("model.embed_tokens.weight", [a.vocab, a.hidden], w.draw("embed", [a.vocab, a.hidden], "embed"))]
    for l in range(a.layers):
        out += layer_tensors(a, w, l, arch)
    out.append(("model.norm.weight", [a.hidden], w.draw("output_norm", [a.hidden], "norm")))
    if not a.tied:
        out.append(("lm_head.weight", [a.vocab, a.hidden], w.draw("output", [a.vocab, a.hidden], "w")))
    for spec in a.extra:
        name, dims = spec.split(":")
        shape = [int(d) for d in dims.split(",")]
        out.append((name, shape, w.draw(name, shape, "w")))
    return [t for t in out if t[0] not in a.drop]


def config(a, arch):
    cls, model_type, moe, _, _ = ARCHS[arch]
    c = {"architectures": [cls], "model_type": model_type, "_name_or_path": a.name or arch,
         "vocab_size": a.vocab, "hidden_size": a.hidden, "num_hidden_layers": a.layers,
         "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads, "head_dim": a.head_dim,
         "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "tie_word_embeddings": a.tied, "hidden_act": "silu", "intermediate_size": a.ff,
         "torch_dtype": {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}[a.dtype]}
    if moe == "mixtral":
        c.update(num_local_experts=a.experts, num_experts_per_tok=a.top_k, intermediate_size=a.expert_ff)
    elif moe == "olmoe":
        c.update(num_experts=a.experts, num_experts_per_tok=a.top_k, intermediate_size=a.expert_ff,
                 norm_topk_prob=a.norm_topk, clip_qkv=None)
    elif moe == "qwen":
        c.update(num_experts=a.experts, num_experts_per_tok=a.top_k, moe_intermediate_size=a.expert_ff,
                 norm_topk_prob=a.norm_topk, decoder_sparse_step=1, mlp_only_layers=[])
        if arch == "qwen2moe":
            c["shared_expert_intermediate_size"] = a.shared_ff
    for item in a.set:
        key, value = item.split("=", 1)
        c[key] = json.loads(value)
    return c


# ---------------------------------------------------------------- files

def write_safetensors(path, tensors, dtype):
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, shape, values in tensors:
        blob = encode(values, dtype)
        header[name] = {"dtype": {"f32": "F32", "f16": "F16", "bf16": "BF16"}[dtype], "shape": shape,
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def write_weights(out, tensors, dtype, shards):
    if shards <= 1:
        write_safetensors(os.path.join(out, "model.safetensors"), tensors, dtype)
        return
    per = -(-len(tensors) // shards)
    weight_map = {}
    for s in range(shards):
        name = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
        part = tensors[s * per:(s + 1) * per]
        write_safetensors(os.path.join(out, name), part, dtype)
        weight_map.update({t[0]: name for t in part})
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)


def byte_alphabet():
    """GPT-2's byte-to-character map: printable bytes stand for themselves."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    extra = [b for b in range(256) if b not in keep]
    table = {b: chr(b) for b in keep}
    table.update({b: chr(256 + i) for i, b in enumerate(extra)})
    return [table[b] for b in range(256)]


def write_tokenizer(out):
    vocab = {ch: i for i, ch in enumerate(byte_alphabet())}
    added = [{"id": 256 + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in enumerate(SPECIALS)]
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "post_processor": None, "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                     "merges": []}}
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tok, f)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": CHATML}, f)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("arch", choices=sorted(ARCHS))
    p.add_argument("out")
    p.add_argument("--dtype", choices=["f32", "f16", "bf16"], default="f32")
    p.add_argument("--round", choices=["f16", "bf16"], help="store values rounded to this type (in --dtype)")
    p.add_argument("--fused", action="store_true", help="experts fused as Transformers 5 keeps them")
    p.add_argument("--shards", type=int, default=1)
    p.add_argument("--tied", action="store_true")
    p.add_argument("--zero-bias", action="store_true", help="q/k/v biases of zero")
    p.add_argument("--norm-topk", action="store_true", help="norm_topk_prob true (Qwen-MoE, OLMoE)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--name", help="_name_or_path (default: the architecture)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=16)
    p.add_argument("--ff", type=int, default=96)
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--expert-ff", type=int, default=32)
    p.add_argument("--shared-ff", type=int, default=0, help="qwen2moe's shared expert width")
    p.add_argument("--vocab", type=int, default=300)
    p.add_argument("--set", action="append", default=[], metavar="KEY=JSON", help="override a config.json key")
    p.add_argument("--extra", action="append", default=[], metavar="NAME:D0,D1", help="add a tensor")
    p.add_argument("--drop", action="append", default=[], metavar="NAME", help="leave a tensor out")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    tensors = all_tensors(a, a.arch)
    if a.round:
        tensors = [(n, s, rounded(v, a.round)) for n, s, v in tensors]
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config(a, a.arch), f, indent=1)
    write_weights(a.out, tensors, a.dtype, a.shards)
    write_tokenizer(a.out)


if __name__ == "__main__":
    main()
