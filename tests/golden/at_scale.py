#!/usr/bin/env python3
"""The reference at scale: Qwen3-30B-A3B's full dimensions, two layers.

A randomly initialised Qwen3MoeForCausalLM with the real model's widths
(hidden 2048, 32 query and 4 key/value heads of 128, 128 experts of width
768 with 8 active, vocabulary 151936) but 2 layers, saved as a Hugging Face
checkpoint in float32 together with teacher-forced reference logits from
transformers (eager attention, float32). scripts/at_scale_check.sh then
converts it with `moe convert`, runs `moe logits` on the CPU and compares.
Runs on the GPU machine (torch, transformers); the forward runs on the GPU
when there is one, in float32 with TF32 off.

usage: at_scale.py OUTDIR
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (the fixtures' tokenizer, config and initialisation)

SEQUENCE_LENGTH = 24


def main():
    out = sys.argv[1]
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    mf.HIDDEN, mf.LAYERS = 2048, 2
    tok = mf.train_tokenizer()
    special_ids = {t: tok.token_to_id(t) for t in mf.SPECIALS}
    f = mf.fixture("qwen3moe_30b_a3b_2layers", "Qwen3Moe", 32, 4, head_dim=128, ff=6144, theta=1e6,
                   num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True)
    model = mf.build_model(f, 151936, special_ids, 4321)
    params = sum(p.numel() for p in model.parameters())
    gen = torch.Generator().manual_seed(99)
    ids = torch.randint(0, tok.get_vocab_size(), (SEQUENCE_LENGTH,), generator=gen).tolist()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.no_grad():
        logits = model.to(device)(torch.tensor([ids], device=device), use_cache=False).logits[0].float().cpu()
    model.to("cpu").save_pretrained(out, safe_serialization=True)
    mf.save_tokenizer(tok, out)
    logits.numpy().astype("<f4").tofile(os.path.join(out, "reference_logits.f32"))
    with open(os.path.join(out, "reference.json"), "w") as fh:
        json.dump({"ids": ids, "vocab": 151936, "params": params}, fh)
    print("at scale: %.3f B parameters, %d tokens, logits rms %.3f, written to %s" % (
        params / 1e9, len(ids), float(logits.pow(2).mean().sqrt()), out))


if __name__ == "__main__":
    main()
