#!/usr/bin/env python3
"""Golden fixtures: tiny random models and their Hugging Face reference outputs.

For every architecture `moe convert` reads, this builds at least two tiny
random-initialised models with Transformers (varying GQA ratio, head_dim,
q/k norm, shared expert, top-k renormalisation, tied embeddings, RoPE
scaling), saves each as a checkpoint directory, and records what
Transformers computes from the saved checkpoint: the float32 logits of three
token sequences (teacher-forced) and a greedy continuation of 16 tokens
after each. tests/golden/test_golden.sh converts every directory with
`moe convert` and holds moe.c to these numbers.

Needs python3 with torch, transformers, tokenizers and safetensors; no
network. Runs on the CPU in float32 with eager attention and fixed seeds:
about 20 s with Transformers 5.17 and torch 2.11, writing 16 fixtures
(9 MB, mostly float32 weights) that go to tests/golden/fixtures.

    python3 tests/golden/make_fixtures.py OUT_DIR          # all fixtures
    python3 tests/golden/make_fixtures.py OUT_DIR --check  # one model per
        architecture: builds it, runs it, prints its config; writes nothing

Each fixture directory holds the checkpoint (config.json, safetensors,
tokenizer.json, tokenizer_config.json) and reference.json:

    {"name", "class", "transformers", "torch", "weights": "float32" |
     "bfloat16", "layout": "per-expert" | "fused" | "sharded" | "dense",
     "n_vocab", "sequences": [{"text", "ids", "logits": FILE, "logits_rms",
     "greedy": [16 ids], "greedy_margins": [top-1 minus top-2 logit]}]}

with each FILE raw little-endian float32, len(ids) x n_vocab. Any surprise
(a config field Transformers ignored, a layout that did not come out, a
reload that changes the outputs) stops the script with an error.
"""
import argparse
import inspect
import json
import math
import os
import shutil
import sys
import time

import safetensors
import tokenizers
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
VOCAB_TARGET = 320
HIDDEN = 64
LAYERS = 2
GREEDY_TOKENS = 16

# The tokenizer's training text: plain English with digits and punctuation.
CORPUS = """
The river ran quietly past the old mill, where the miller kept his books and counted the sacks of grain
every evening. In the spring of 1894 the water rose higher than anyone could remember, and the town
gathered on the bridge to watch it. Children threw sticks into the current and raced to the other side
to see whose stick came out first. The miller said the river had a memory of its own: it remembered
every stone that had ever been moved and every dam that had ever been built, and it would return to
its old course sooner or later. Nobody believed him, but nobody built on the low meadow either.
A model reads text as tokens, and a tokenizer decides where one token ends and the next begins.
Numbers such as 42, 3.14 and 2024 are split into pieces; words that occur often become single tokens.
What is the capital of France? Paris is the capital of France. How many legs does a spider have?
A spider has eight legs. Please answer briefly and clearly, and explain your reasoning step by step.
The weather today is cold and windy, with rain in the afternoon and clear skies at night.
"""

SEQUENCES = [
    "The river ran.",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "In the spring of 1894 the water rose higher than anyone could remember.",
]


def fail(message):
    sys.exit("make_fixtures.py: " + message)


# ---------------------------------------------------------------- tokenizer

def train_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_TARGET, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([line for line in CORPUS.splitlines() if line] * 4, trainer)
    if tok.get_vocab_size() != VOCAB_TARGET:
        fail("the tokenizer has %d tokens, expected %d (corpus too small?)" % (tok.get_vocab_size(), VOCAB_TARGET))
    return tok


def save_tokenizer(tok, out):
    tok.save(os.path.join(out, "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
              "pad_token": "<|endoftext|>", "add_bos_token": False, "model_max_length": 256,
              "clean_up_tokenization_spaces": False, "chat_template": CHATML}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=1)


# ---------------------------------------------------------------- models

def rope_kwargs(config_cls, theta, scaling):
    """Transformers 5 takes rope_parameters; earlier versions rope_theta and rope_scaling."""
    if "rope_parameters" in inspect.signature(config_cls.__init__).parameters:
        params = {"rope_type": "default", "rope_theta": theta}
        params.update(scaling or {})
        return {"rope_parameters": params}
    return {"rope_theta": theta, "rope_scaling": scaling}


def fixture(name, cls, heads, kv_heads, head_dim=None, ff=96, tied=False, eps=1e-6, theta=10000.0, rope=None,
            save="plain", **extra):
    return dict(name=name, cls=cls, heads=heads, kv_heads=kv_heads, head_dim=head_dim, ff=ff, tied=tied, eps=eps,
                theta=theta, rope=rope, save=save, extra=extra)


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}
LINEAR = {"rope_type": "linear", "factor": 2.0}

# save: plain, bf16 (weights stored as bfloat16), fused (Transformers 5's
# expert layout, save_original_format=False) or sharded (small shards + index).
FIXTURES = [
    fixture("llama_gqa", "Llama", 4, 2, ff=128),
    fixture("llama_hd24_tied_llama3", "Llama", 4, 1, head_dim=24, tied=True, eps=1e-5, rope=LLAMA3),
    fixture("mistral_mha_linear", "Mistral", 4, 4, rope=LINEAR, sliding_window=None),
    fixture("mistral_gqa_window", "Mistral", 8, 2, eps=1e-5, sliding_window=4096, save="sharded"),
    fixture("mixtral_e4k2", "Mixtral", 4, 2, ff=40, theta=1e6, num_local_experts=4, num_experts_per_tok=2,
            save="fused"),
    fixture("mixtral_e8k3_hd12_tied", "Mixtral", 4, 1, head_dim=12, ff=24, tied=True, num_local_experts=8,
            num_experts_per_tok=3),
    fixture("qwen2_gqa", "Qwen2", 4, 2),
    fixture("qwen2_mha_tied", "Qwen2", 2, 2, tied=True, save="bf16"),
    fixture("qwen2moe_shared", "Qwen2Moe", 4, 2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
            shared_expert_intermediate_size=48, norm_topk_prob=False),
    fixture("qwen2moe_norm_topk_tied", "Qwen2Moe", 4, 4, tied=True, num_experts=8, num_experts_per_tok=2,
            moe_intermediate_size=16, shared_expert_intermediate_size=64, norm_topk_prob=True, save="bf16"),
    fixture("qwen3_hd32", "Qwen3", 4, 2, head_dim=32),
    fixture("qwen3_hd8_tied", "Qwen3", 8, 4, head_dim=8, tied=True),
    fixture("qwen3moe_norm_hd24", "Qwen3Moe", 4, 2, head_dim=24, num_experts=8, num_experts_per_tok=2,
            moe_intermediate_size=40, norm_topk_prob=True, save="sharded"),
    fixture("qwen3moe_nonorm_tied", "Qwen3Moe", 4, 4, head_dim=16, tied=True, num_experts=6, num_experts_per_tok=3,
            moe_intermediate_size=24, norm_topk_prob=False, save="fused"),
    fixture("olmoe_e4k2", "Olmoe", 4, 4, ff=32, eps=1e-5, num_experts=4, num_experts_per_tok=2, norm_topk_prob=False),
    fixture("olmoe_gqa_norm_tied", "Olmoe", 4, 2, ff=24, tied=True, eps=1e-5, num_experts=8, num_experts_per_tok=2,
            norm_topk_prob=True),
]


def classes(short):
    return getattr(transformers, short + "Config"), getattr(transformers, short + "ForCausalLM")


def make_config(f, vocab, special_ids):
    config_cls, _ = classes(f["cls"])
    kwargs = dict(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=f["ff"], num_hidden_layers=LAYERS,
                  num_attention_heads=f["heads"], num_key_value_heads=f["kv_heads"], max_position_embeddings=256,
                  rms_norm_eps=f["eps"], tie_word_embeddings=f["tied"], hidden_act="silu",
                  bos_token_id=special_ids["<|endoftext|>"], eos_token_id=special_ids["<|im_end|>"],
                  pad_token_id=special_ids["<|endoftext|>"], attn_implementation="eager")
    if f["head_dim"]:
        kwargs["head_dim"] = f["head_dim"]
    kwargs.update(rope_kwargs(config_cls, f["theta"], f["rope"]))
    kwargs.update(f["extra"])
    config = config_cls(**kwargs)
    for key, want in [("tie_word_embeddings", f["tied"]), ("num_key_value_heads", f["kv_heads"])] + list(
            f["extra"].items()):
        if getattr(config, key, "absent") != want:
            fail("%s: %s ignored %s=%r (has %r)" % (f["name"], config_cls.__name__, key, want,
                                                   getattr(config, key, "absent")))
    return config


def init_weights(model, seed):
    """Weights wide enough that attention, routing and the head are far from uniform."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if p.device.type == "meta":
                fail("parameter %s was left on the meta device" % name)
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if p.dim() == 1 and "norm" in name:
                value = 1.0 + 0.2 * noise
            elif name.endswith(".bias"):
                value = 0.2 * noise
            elif name.endswith("embed_tokens.weight"):
                value = noise
            elif name.endswith(".gate.weight") or name.endswith("router.weight"):
                value = 0.3 * noise
            else:
                value = noise / math.sqrt(p.shape[-1])
            p.copy_(value)


def check_shapes(f, model):
    attn = model.model.layers[0].self_attn
    head_dim = f["head_dim"] or HIDDEN // f["heads"]
    want_q, want_k = (f["heads"] * head_dim, HIDDEN), (f["kv_heads"] * head_dim, HIDDEN)
    if tuple(attn.q_proj.weight.shape) != want_q or tuple(attn.k_proj.weight.shape) != want_k:
        fail("%s: q_proj %s, k_proj %s, expected %s and %s (head_dim ignored?)" % (
            f["name"], tuple(attn.q_proj.weight.shape), tuple(attn.k_proj.weight.shape), want_q, want_k))
    want_bias = f["cls"] in ("Qwen2", "Qwen2Moe")
    if (attn.q_proj.bias is not None) != want_bias or attn.o_proj.bias is not None:
        fail("%s: q_proj bias %s, o_proj bias %s; expected q/k/v biases exactly for Qwen2 and Qwen2-MoE" % (
            f["name"], attn.q_proj.bias is not None, attn.o_proj.bias is not None))
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    if tied != f["tied"]:
        fail("%s: lm_head tied=%s, expected %s" % (f["name"], tied, f["tied"]))


def build_model(f, vocab, special_ids, seed):
    _, model_cls = classes(f["cls"])
    torch.manual_seed(seed)
    model = model_cls(make_config(f, vocab, special_ids))
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("eager")
    impl = getattr(model.config, "_attn_implementation", "eager")
    if impl != "eager":
        fail("%s: attention implementation is %r, not eager" % (f["name"], impl))
    init_weights(model, seed)
    check_shapes(f, model)
    return model.float().eval()


# ---------------------------------------------------------------- saving

def save_checkpoint(f, model, out):
    os.makedirs(out)
    kind = f["save"]
    if kind == "bf16":
        model.to(torch.bfloat16).save_pretrained(out)
        model.float()
    elif kind == "sharded":
        model.save_pretrained(out, max_shard_size="100KB")
    elif kind == "fused" and int(transformers.__version__.split(".")[0]) < 5:
        print("  note: Transformers before 5 has no fused expert layout; %s saved per expert" % f["name"])
        kind = "plain"
        model.save_pretrained(out)
    elif kind == "fused":
        model.save_pretrained(out, save_original_format=False)
    else:
        model.save_pretrained(out)
    return check_layout(f, out, kind)


def checkpoint_keys(out):
    keys = {}
    for name in sorted(os.listdir(out)):
        if name.endswith(".safetensors"):
            with safetensors.safe_open(os.path.join(out, name), framework="pt") as st:
                for key in st.keys():
                    keys[key] = st.get_slice(key).get_dtype()
    return keys


def check_layout(f, out, kind):
    keys = checkpoint_keys(out)
    has_index = os.path.exists(os.path.join(out, "model.safetensors.index.json"))
    fused = any(k.endswith("experts.gate_up_proj") for k in keys)
    moe = any(".experts." in k for k in keys)
    dtypes = set(keys.values())
    if kind == "sharded" and not has_index:
        fail("%s: max_shard_size did not shard the checkpoint" % f["name"])
    if kind == "fused" and not fused:
        fail("%s: save_original_format=False did not write fused experts" % f["name"])
    if dtypes != {"BF16" if kind == "bf16" else "F32"}:
        fail("%s: checkpoint dtypes %s" % (f["name"], sorted(dtypes)))
    if kind in ("plain", "bf16"):
        return "fused" if fused else "per-expert" if moe else "dense"
    return kind


# ---------------------------------------------------------------- references

def forward(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids]), use_cache=False).logits[0].float()


def greedy(model, ids):
    ids, out, margins = list(ids), [], []
    for _ in range(GREEDY_TOKENS):
        top = torch.topk(forward(model, ids)[-1], 2)
        out.append(int(top.indices[0]))
        margins.append(float(top.values[0] - top.values[1]))
        ids.append(out[-1])
    return out, margins


def reload(f, out):
    _, model_cls = classes(f["cls"])
    model = model_cls.from_pretrained(out, attn_implementation="eager")
    return model.float().eval()


def write_references(f, model, out, tok, layout, weights):
    sequences = []
    for i, text in enumerate(SEQUENCES):
        ids = tok.encode(text).ids
        if not 6 <= len(ids) <= 48:
            fail("sequence %d has %d tokens; want 6 to 48" % (i, len(ids)))
        logits = forward(model, ids)
        path = "logits_%d.f32" % i
        logits.numpy().astype("<f4").tofile(os.path.join(out, path))
        cont, margins = greedy(model, ids)
        sequences.append({"text": text, "ids": ids, "logits": path,
                          "logits_rms": float(logits.pow(2).mean().sqrt()), "greedy": cont,
                          "greedy_margins": margins})
    ref = {"name": f["name"], "class": classes(f["cls"])[1].__name__, "transformers": transformers.__version__,
           "torch": torch.__version__, "weights": weights, "layout": layout, "n_vocab": tok.get_vocab_size(),
           "sequences": sequences}
    with open(os.path.join(out, "reference.json"), "w") as fh:
        json.dump(ref, fh, indent=1)
    return ref


def make_fixture(f, tok, special_ids, out_root, seed):
    out = os.path.join(out_root, f["name"])
    model = build_model(f, tok.get_vocab_size(), special_ids, seed)
    layout = save_checkpoint(f, model, out)
    save_tokenizer(tok, out)
    loaded = reload(f, out)
    probe = tok.encode(SEQUENCES[1]).ids
    if f["save"] != "bf16":
        diff = float((forward(loaded, probe) - forward(model, probe)).abs().max())
        if diff > 1e-5:
            fail("%s: the reloaded checkpoint computes other logits (max diff %g)" % (f["name"], diff))
    weights = "bfloat16" if f["save"] == "bf16" else "float32"
    return write_references(f, loaded, out, tok, layout, weights)


# ---------------------------------------------------------------- main

def describe(f, model):
    c = model.config
    fields = ["hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
              "rms_norm_eps", "tie_word_embeddings", "rope_theta", "rope_scaling", "rope_parameters",
              "num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
              "shared_expert_intermediate_size", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers",
              "clip_qkv", "sliding_window", "use_sliding_window"]
    shown = {}
    for key in fields:
        try:
            shown[key] = getattr(c, key)
        except Exception:  # a deprecated field may raise instead of being absent
            continue
    n_params = sum(p.numel() for p in model.parameters())
    print("%s (%s): %d parameters\n  %s" % (f["name"], type(model).__name__, n_params, shown))
    for name, p in model.named_parameters():
        if ".layers.0." in name:
            print("    %-60s %s" % (name, tuple(p.shape)))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="output directory (replaced)")
    parser.add_argument("--check", action="store_true", help="one model per architecture, printed, nothing written")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    torch.set_num_threads(4)
    torch.use_deterministic_algorithms(True)
    print("transformers %s, torch %s, tokenizers %s, safetensors %s" % (
        transformers.__version__, torch.__version__, tokenizers.__version__, safetensors.__version__))
    tok = train_tokenizer()
    special_ids = {t: tok.token_to_id(t) for t in SPECIALS}
    print("tokenizer: %d tokens, specials %s, sequence lengths %s" % (
        tok.get_vocab_size(), special_ids, [len(tok.encode(s).ids) for s in SEQUENCES]))
    if args.check:
        seen = set()
        for i, f in enumerate(FIXTURES):
            if f["cls"] not in seen:
                seen.add(f["cls"])
                model = build_model(f, tok.get_vocab_size(), special_ids, args.seed + i)
                describe(f, model)
                print("  logits rms %.3f" % float(forward(model, tok.encode(SEQUENCES[0]).ids).pow(2).mean().sqrt()))
        return
    if os.path.exists(args.out):
        shutil.rmtree(args.out)
    os.makedirs(args.out)
    total = 0
    for i, f in enumerate(FIXTURES):
        start = time.time()
        ref = make_fixture(f, tok, special_ids, args.out, args.seed + i)
        size = sum(os.path.getsize(os.path.join(args.out, f["name"], n)) for n in os.listdir(os.path.join(args.out, f["name"])))
        total += size
        margin = min(m for s in ref["sequences"] for m in s["greedy_margins"])
        print("%-28s %-22s %-10s %-9s %4d KB  seq %-12s min greedy margin %.4f  %.1fs" % (
            f["name"], ref["class"], ref["layout"], ref["weights"], size // 1024,
            ",".join(str(len(s["ids"])) for s in ref["sequences"]), margin, time.time() - start))
    print("%d fixtures, %.2f MB in %s" % (len(FIXTURES), total / 1e6, args.out))


if __name__ == "__main__":
    main()
