#!/usr/bin/env python3
"""train_demo.py — train moe.c's demo model: a small Qwen3-MoE that speaks English.

    python3 training/train_demo.py --corpus data/demo --tokenizer RUN/tokenizer \\
        --work RUN --out OUT [--max-minutes 7] [--smoke] [--resume]

The model is transformers' Qwen3MoeForCausalLM built from a Qwen3MoeConfig
(architecture `qwen3moe` in GGUF): by default 6 layers, hidden 256, 4 query
heads and 2 key/value heads of 64, 16 routed experts of which 4 are used
(moe_intermediate_size 256, top-k weights renormalised), RoPE theta 10000,
context 512, embeddings tied to the output head: 22.18 M parameters.

Training (one H200, 56 ms a step, 3.8 s an epoch): AdamW, bf16 autocast over fp32
weights, warmup then cosine decay, batches of 64 x 512 tokens drawn from the
corpus reshuffled every epoch, residual dropout (forward hooks, so the saved
model is plain Qwen3-MoE), and a Switch-style load-balancing loss on the
routers' raw logits (computed here from the router inputs, because
transformers' own aux loss is fed softmax probabilities by some versions).
--epochs may list several values: each is a fresh run from the same seed
and the one with the lowest validation loss wins (validation = every 50th
training document, never heldout.txt). A wall-clock budget (--max-minutes)
caps the whole sweep: once the step time is measured the schedule of the
run in progress is shortened to fit, so the cosine decay always completes.

Evaluation, the recipe `moe perplexity -f heldout.txt --ctx 256` repeats:
heldout.txt is tokenized whole (no BOS), cut into non-overlapping windows of
256 tokens (the tail shorter than a window is dropped), each window is run
from an empty context, every position but the window's first is scored, and
perplexity = exp(mean negative log-likelihood) over all scored positions.
Computed in fp32, on the model in memory and again on the exported float16
files reloaded with from_pretrained.

Outputs: WORK/ holds checkpoints (resumable with --resume), the training log,
the float32 save_pretrained folder (final-f32/) and the export (demo-moe/:
float16 safetensors in the canonical per-expert Qwen3-MoE layout, config.json,
tokenizer.json, tokenizer_config.json). OUT/ gets what comes back from the
GPU machine: demo-moe.tar.partNN (the export, train_log.csv, summary.json
and samples.txt in one tar, cut into pieces of 15 MiB; `cat
demo-moe.tar.part* | tar x` joins them), plus train_log.csv, summary.json and
samples.txt alone.
"""
import argparse
import csv
import hashlib
import io
import json
import lzma
import math
import os
import re
import shutil
import sys
import tarfile
import time
import types

import numpy as np
import torch
import torch.nn.functional as F

PART_BYTES = 15 * 1024 * 1024
T0 = time.time()


def log(msg):
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


# ------------------------------------------------------------------ arguments

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True, help="folder with train.txt[.xz], heldout.txt[.xz], train_chat.jsonl[.xz]")
    ap.add_argument("--tokenizer", required=True, help="folder with tokenizer.json and tokenizer_config.json")
    ap.add_argument("--work", required=True, help="checkpoints, logs and saved models")
    ap.add_argument("--out", required=True, help="what comes back from the GPU machine")
    ap.add_argument("--seed", type=int, default=1234)
    m = ap.add_argument_group("model")
    m.add_argument("--layers", type=int, default=6)
    m.add_argument("--hidden", type=int, default=256)
    m.add_argument("--heads", type=int, default=4)
    m.add_argument("--kv-heads", type=int, default=2)
    m.add_argument("--experts", type=int, default=16)
    m.add_argument("--top-k", type=int, default=4)
    m.add_argument("--expert-ff", type=int, default=256)
    m.add_argument("--ctx", type=int, default=512, help="training sequence length = max_position_embeddings")
    m.add_argument("--rope-theta", type=float, default=10000.0)
    t = ap.add_argument_group("training")
    t.add_argument("--epochs", default="5,10,20,40", help="one value, or several for a sweep chosen on validation")
    t.add_argument("--max-steps", type=int, default=0, help="fix the schedule length (one run); 0: from epochs")
    t.add_argument("--max-minutes", type=float, default=7.0, help="wall-clock budget of all training runs")
    t.add_argument("--batch", type=int, default=64, help="sequences per step")
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--min-lr-frac", type=float, default=0.1)
    t.add_argument("--warmup", type=int, default=50)
    t.add_argument("--weight-decay", type=float, default=0.1)
    t.add_argument("--dropout", type=float, default=0.1)
    t.add_argument("--aux-coef", type=float, default=0.02, help="load-balancing loss weight")
    t.add_argument("--clip", type=float, default=1.0)
    t.add_argument("--no-chat", action="store_true", help="leave train_chat.jsonl out")
    t.add_argument("--experts-impl", choices=["auto", "grouped", "hf"], default="auto",
                   help="training path of the experts: torch._grouped_mm (checked first) or transformers' own")
    e = ap.add_argument_group("evaluation, checkpoints")
    e.add_argument("--eval-ctx", type=int, default=256)
    e.add_argument("--val-every", type=int, default=0, help="steps between validations (0: 20 per run)")
    e.add_argument("--log-every", type=int, default=20)
    e.add_argument("--ckpt-every-s", type=float, default=90.0)
    e.add_argument("--resume", action="store_true", help="continue from WORK/ckpt.pt")
    e.add_argument("--stop-after", type=int, default=0, help="exit after this many steps, checkpoint saved (tests resume)")
    e.add_argument("--smoke", action="store_true", help="tiny model, 20 steps, small data: checks everything end to end")
    args = ap.parse_args(argv)
    args.epoch_list = [float(x) for x in str(args.epochs).split(",") if x.strip()]
    if args.smoke:
        args.layers, args.hidden, args.heads, args.kv_heads = 2, 128, 2, 1
        args.experts, args.top_k, args.expert_ff, args.ctx = 4, 2, 128, 128
        args.batch, args.warmup, args.log_every, args.val_every = 8, 5, 5, 10
        args.eval_ctx = 128
        args.epoch_list = [1.0]
        if not args.max_steps:
            args.max_steps = 20
    if args.max_steps and len(args.epoch_list) > 1:
        args.epoch_list = args.epoch_list[-1:]
    return args


# ------------------------------------------------------------------ data

def read_text(folder, name):
    path = os.path.join(folder, name)
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    with lzma.open(path + ".xz", "rt", encoding="utf-8") as f:
        return f.read()


def chatml(user, assistant):
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{assistant}<|im_end|>\n"


class Corpus:
    """Token units (a document with its blank line, or a one-turn chat), the
    validation stream and the held-out stream, all int64."""

    def __init__(self, args, tok):
        train_text = read_text(args.corpus, "train.txt")
        held_text = read_text(args.corpus, "heldout.txt")
        chats = [] if args.no_chat else [json.loads(ln) for ln in read_text(args.corpus, "train_chat.jsonl").splitlines() if ln]
        self.sha = {"train.txt": hashlib.sha256(train_text.encode()).hexdigest(),
                    "heldout.txt": hashlib.sha256(held_text.encode()).hexdigest()}
        docs = [d for d in train_text.rstrip("\n").split("\n\n") if d]
        if args.smoke:
            docs, chats = docs[:3000], chats[:300]
        val_docs = docs[::50]
        train_docs = [d for i, d in enumerate(docs) if i % 50]
        val_set = set(val_docs)
        chats = [c for c in chats if c["assistant"] not in val_set]
        units = [d + "\n\n" for d in train_docs] + [chatml(c["user"], c["assistant"]) for c in chats]
        enc = tok.encode_batch(units)
        self.units = [np.asarray(e.ids, dtype=np.int64) for e in enc]
        self.n_train_tokens = int(sum(len(u) for u in self.units))
        self.n_chat_tokens = int(sum(len(u) for u in self.units[len(train_docs):]))
        self.val = torch.tensor(np.concatenate([np.asarray(e.ids, dtype=np.int64)
                                                for e in tok.encode_batch([d + "\n\n" for d in val_docs])]))
        # Held-out: the whole file at once, as moe perplexity tokenizes it.
        self.held = torch.tensor(tok.encode(held_text).ids, dtype=torch.int64)
        per_doc = sum(len(e.ids) for e in tok.encode_batch([d + "\n\n" for d in held_text.rstrip("\n").split("\n\n")]))
        self.held_per_doc_tokens = per_doc  # equal but for the file's last newline: a check on the tokenizer
        self.counts = {"train_docs": len(train_docs), "val_docs": len(val_docs), "chats": len(chats),
                       "train_tokens_per_epoch": self.n_train_tokens, "chat_tokens_per_epoch": self.n_chat_tokens,
                       "val_tokens": int(self.val.numel()), "heldout_tokens": int(self.held.numel()),
                       "heldout_chars": len(held_text)}

    def epoch(self, seed, epoch, ctx, batch):
        """The sequences of one epoch, (n, ctx + 1): units in a permutation
        fixed by (seed, epoch), concatenated and cut; whole batches only."""
        rng = np.random.default_rng([seed, epoch])
        stream = np.concatenate([self.units[i] for i in rng.permutation(len(self.units))])
        n = len(stream) // (ctx + 1) // batch * batch
        return torch.from_numpy(stream[: n * (ctx + 1)].reshape(n, ctx + 1).copy())

    def steps_per_epoch(self, ctx, batch):
        return self.n_train_tokens // (ctx + 1) // batch


# ------------------------------------------------------------------ model

def build_model(args, vocab_size, eos_id, pad_id):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    if args.hidden // args.heads != 64 or args.hidden % args.heads:
        raise SystemExit("train_demo: hidden / heads must be 64 (head_dim 64 without passing head_dim)")
    common = dict(
        vocab_size=vocab_size, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        hidden_act="silu", max_position_embeddings=args.ctx, initializer_range=0.02, rms_norm_eps=1e-6,
        use_cache=False, tie_word_embeddings=True, attention_bias=False,
        use_sliding_window=False, attention_dropout=0.0, decoder_sparse_step=1,
        moe_intermediate_size=args.expert_ff, num_experts_per_tok=args.top_k, num_experts=args.experts,
        norm_topk_prob=True, output_router_logits=False, router_aux_loss_coef=args.aux_coef, mlp_only_layers=[],
        bos_token_id=None, eos_token_id=eos_id, pad_token_id=pad_id)
    try:  # the legacy key: transformers 4 reads it, 5 moves it into rope_parameters
        cfg = Qwen3MoeConfig(rope_theta=args.rope_theta, **common)
    except (TypeError, ValueError) as exc:
        log(f"config: rope_theta refused ({exc}); passing rope_parameters")
        cfg = Qwen3MoeConfig(rope_parameters={"rope_type": "default", "rope_theta": args.rope_theta}, **common)
    try:
        cfg._attn_implementation = "sdpa"
    except Exception as exc:  # older or newer configs without the setter
        log(f"attention: could not select sdpa ({exc}); using the default")
    torch.manual_seed(args.seed)
    model = Qwen3MoeForCausalLM(cfg)
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    if not tied:
        model.tie_weights()
        tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    if not tied:
        log("warning: transformers did not tie the output head; saving it untied")
        model.config.tie_word_embeddings = False
    force_eager_experts(model)
    init_weights(model, args)
    check_model(model, args)
    return model, tied


def force_eager_experts(model):
    """transformers 5 may pick its own experts kernel (grouped_mm, bf16);
    evaluation here wants its plain fp32 loop, so ask for "eager"."""
    try:
        if hasattr(model.config, "_experts_implementation"):
            model.config._experts_implementation = "eager"
    except Exception as exc:  # noqa: BLE001
        log(f"experts: could not select the eager implementation ({exc})")


def init_weights(model, args):
    """Our own initialisation, the same under any transformers version:
    norms 1, matrices N(0, 0.02), the residual outputs (o_proj, experts'
    down_proj) N(0, 0.02 / sqrt(2 * layers)), from a CPU generator."""
    g = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)
                continue
            std = 0.02
            if name.endswith("o_proj.weight") or "down_proj" in name:
                std /= math.sqrt(2 * args.layers)
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32) * std)


def rope_theta_of(config):
    rp = getattr(config, "rope_parameters", None)
    if isinstance(rp, dict) and "rope_theta" in rp:
        return float(rp["rope_theta"])
    return float(getattr(config, "rope_theta"))


def check_model(model, args):
    """What moe.c will assume of the file: head_dim 64, RoPE theta, every
    layer a sparse MoE block with a router of shape (experts, hidden)."""
    attn = model.model.layers[0].self_attn
    assert getattr(attn, "head_dim", 64) == 64, f"head_dim is {attn.head_dim}"
    theta = rope_theta_of(model.config)
    assert abs(theta - args.rope_theta) < 1e-3, f"rope theta is {theta}"
    inv = next(m.inv_freq for m in model.modules() if isinstance(getattr(m, "inv_freq", None), torch.Tensor)).float()
    want = 1.0 / (args.rope_theta ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64))
    assert torch.allclose(inv.cpu(), want, rtol=1e-5), "rotary inv_freq differs from theta^(-2i/64)"
    for i, layer in enumerate(model.model.layers):
        gate = getattr(layer.mlp, "gate", None)
        assert gate is not None and tuple(gate.weight.shape) == (args.experts, args.hidden), f"layer {i} has no router"


def count_params(model, tied):
    n = sum(p.numel() for p in model.parameters())  # parameters() lists a tied weight once
    experts = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name or name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"))
    return {"total": n, "experts": experts, "tied_embeddings": tied}


# ------------------------------------------------------------------ experts

def reference_experts(gate_up, down, act, x, idx, w):
    """Plain fp32 loop, the meaning of the fused layout: gate_up (E, 2I, H)
    with the gate rows first, down (E, H, I)."""
    out = torch.zeros_like(x)
    inter = gate_up.shape[1] // 2
    for e in range(gate_up.shape[0]):
        tok, slot = (idx == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        gu = x[tok] @ gate_up[e].t()
        h = act(gu[:, :inter]) * gu[:, inter:]
        out.index_add_(0, tok, (h @ down[e].t()) * w[tok, slot, None])
    return out


def grouped_experts(self, hidden_states, top_k_index, top_k_weights):
    """The routed experts with two torch._grouped_mm calls in bf16 and no
    host synchronisation: slots sorted by expert, one GEMM per projection."""
    T, H = hidden_states.shape
    k = top_k_index.shape[-1]
    E = self.gate_up_proj.shape[0]
    if top_k_weights.shape[-1] != k:  # (T, E) weights: pick the chosen ones
        top_k_weights = top_k_weights.gather(1, top_k_index)
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    tok = torch.div(order, k, rounding_mode="floor")
    counts = torch.zeros(E, dtype=torch.int32, device=flat.device).scatter_add_(
        0, flat, torch.ones_like(flat, dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    with torch.autocast("cuda", enabled=False):
        x = hidden_states[tok].to(torch.bfloat16)
        gu = torch._grouped_mm(x, self.gate_up_proj.to(torch.bfloat16).transpose(-2, -1), offs=offs)
        inter = gu.shape[-1] // 2
        h = self._moec_act(gu[:, :inter]) * gu[:, inter:]
        y = torch._grouped_mm(h, self.down_proj.to(torch.bfloat16).transpose(-2, -1), offs=offs)
        y = y.float() * top_k_weights.reshape(-1)[order].float().unsqueeze(-1)
        out = torch.zeros((T, H), dtype=torch.float32, device=hidden_states.device)
        out.index_add_(0, tok, y)
    return out.to(hidden_states.dtype)


def install_experts(model, args):
    """Training uses grouped_experts where the layout is the fused one and a
    self-test agrees with the reference; evaluation and generation always
    use transformers' own forward (fp32). Returns (path, layout_fused)."""
    experts = model.model.layers[0].mlp.experts
    fused = isinstance(getattr(experts, "gate_up_proj", None), torch.Tensor) and experts.gate_up_proj.dim() == 3
    if not fused:
        log("experts: per-expert modules (no fused gate_up_proj): transformers' forward everywhere")
        return "hf", False
    E, two_i, H = experts.gate_up_proj.shape
    assert E == args.experts and H == args.hidden and two_i == 2 * args.expert_ff, "unexpected gate_up_proj shape"
    assert tuple(experts.down_proj.shape) == (E, H, args.expert_ff), "unexpected down_proj shape"
    act = getattr(experts, "act_fn", F.silu)
    dev = experts.gate_up_proj.device
    g = torch.Generator(device=dev).manual_seed(7)
    x = torch.randn(300, H, device=dev, generator=g)
    idx = torch.stack([torch.randperm(E, device=dev, generator=g)[: args.top_k] for _ in range(300)])
    w = torch.rand(300, args.top_k, device=dev, generator=g)
    # 1. our reading of the layout agrees with transformers' own forward
    with torch.no_grad():
        ref = reference_experts(experts.gate_up_proj, experts.down_proj, act, x, idx, w)
        try:
            theirs = experts(x, idx, w)
        except Exception as exc:  # noqa: BLE001
            log(f"experts: transformers' forward failed on the self-test ({type(exc).__name__}: {exc})")
            raise
    err = ((theirs - ref).norm() / ref.norm()).item()
    if err > 1e-4:
        raise SystemExit(f"train_demo: the fused experts layout is not the one assumed (relative error {err:.2e}); "
                         "the canonical export would be wrong")
    log(f"experts: fused layout (E, 2I, H) confirmed against transformers' forward (rel. error {err:.1e})")
    if args.experts_impl == "hf" or not hasattr(torch, "_grouped_mm"):
        log("experts: training with transformers' forward")
        return "hf", True
    # 2. the grouped path agrees with the reference, values and gradients
    try:
        for layer in model.model.layers:
            m = layer.mlp.experts
            m._moec_act = getattr(m, "act_fn", F.silu)
        xr = x.clone().requires_grad_(True)
        xg = x.clone().requires_grad_(True)
        r = torch.randn(300, H, device=dev, generator=g)
        out_ref = reference_experts(experts.gate_up_proj, experts.down_proj, act, xr, idx, w)
        (out_ref * r).sum().backward()
        g_ref = (xr.grad.clone(), experts.gate_up_proj.grad.clone(), experts.down_proj.grad.clone())
        experts.zero_grad(set_to_none=True)
        out_g = grouped_experts(experts, xg, idx, w)
        (out_g * r).sum().backward()
        g_new = (xg.grad, experts.gate_up_proj.grad, experts.down_proj.grad)
        errs = [((out_g - out_ref).norm() / out_ref.norm()).item()] + \
               [((a - b).norm() / b.norm()).item() for a, b in zip(g_new, g_ref)]
        experts.zero_grad(set_to_none=True)
        if max(errs) > 3e-2:
            raise RuntimeError("relative errors " + ", ".join(f"{e:.1e}" for e in errs))
    except Exception as exc:  # noqa: BLE001 - any failure means: use the safe path
        experts.zero_grad(set_to_none=True)
        log(f"experts: grouped_mm path refused ({exc}); training with transformers' forward")
        return "hf", True
    if args.experts_impl == "auto" or args.experts_impl == "grouped":
        for layer in model.model.layers:
            m = layer.mlp.experts
            hf_forward = m.forward

            def dispatch(self, hidden_states, top_k_index, top_k_weights, _hf=hf_forward):
                if self.training and torch.is_grad_enabled():
                    return grouped_experts(self, hidden_states, top_k_index, top_k_weights)
                return _hf(hidden_states, top_k_index, top_k_weights)

            m.forward = types.MethodType(dispatch, m)
    log("experts: training with torch._grouped_mm (self-test: rel. errors " + ", ".join(f"{e:.1e}" for e in errs) + ")")
    return "grouped", True


# ------------------------------------------------------------------ hooks

class RouterTap:
    """Recomputes each router's raw logits from its input (a forward hook),
    for the load-balancing loss in training and expert counts in evaluation."""

    def __init__(self, model, n_experts, top_k):
        self.E, self.k = n_experts, top_k
        self.logits, self.counting = [], False
        self.counts = torch.zeros(len(model.model.layers), n_experts, dtype=torch.float64)
        for i, layer in enumerate(model.model.layers):
            layer.mlp.gate.register_forward_hook(self._hook(i))

    def _hook(self, layer_index):
        def hook(module, inputs, output):
            x = inputs[0].reshape(-1, inputs[0].shape[-1])
            if module.training:
                self.logits.append(F.linear(x, module.weight))
            elif self.counting:
                with torch.no_grad():
                    idx = F.linear(x.float(), module.weight.float()).topk(self.k, dim=-1).indices.reshape(-1)
                    self.counts[layer_index] += torch.bincount(idx, minlength=self.E).double().cpu()
        return hook

    def balance_loss(self):
        """Mean over layers of E/k * sum_i f_i P_i (f_i: share of the token
        slots routed to expert i, P_i: its mean router probability); 1.0
        when the routing is uniform."""
        total = 0.0
        for lg in self.logits:
            p = lg.float().softmax(-1)
            idx = p.topk(self.k, dim=-1).indices.reshape(-1)
            f = torch.zeros(self.E, device=p.device).scatter_add_(0, idx, torch.ones_like(idx, dtype=torch.float32))
            f = f / lg.shape[0]
            total = total + (self.E / self.k) * (f * p.mean(0)).sum()
        n = len(self.logits)
        self.logits = []
        return total / max(n, 1)


def add_dropout(model, p):
    """Residual dropout after attention and MoE blocks and on the embeddings,
    as forward hooks: active in training only, invisible in the saved model."""
    if p <= 0:
        return

    def drop(module, inputs, output):
        if not module.training:
            return output
        if isinstance(output, tuple):
            return (F.dropout(output[0], p, True),) + tuple(output[1:])
        return F.dropout(output, p, True)

    model.model.embed_tokens.register_forward_hook(drop)
    for layer in model.model.layers:
        layer.self_attn.register_forward_hook(drop)
        layer.mlp.register_forward_hook(drop)


# ------------------------------------------------------------------ evaluation

@torch.no_grad()
def window_nll(model, ids, ctx, batch=64, max_windows=0):
    """Mean NLL over non-overlapping windows of ctx tokens, every position
    but each window's first scored (moe perplexity's recipe); fp32."""
    was_training = model.training
    model.eval()
    n_win = ids.numel() // ctx
    if max_windows:
        n_win = min(n_win, max_windows)
    if n_win == 0:
        raise SystemExit(f"train_demo: {ids.numel()} tokens are fewer than one window of {ctx}")
    windows = ids[: n_win * ctx].view(n_win, ctx).cuda()
    total, scored = torch.zeros((), dtype=torch.float64, device="cuda"), 0
    for i in range(0, n_win, batch):
        x = windows[i:i + batch]
        logits = model(input_ids=x, use_cache=False).logits.float()
        total += F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                 reduction="sum").double()
        scored += x.shape[0] * (ctx - 1)
    model.train(was_training)
    return total.item() / scored, scored, n_win


@torch.no_grad()
def generate(model, tok, prompt, max_new, temperature, top_k, gen, stop_ids, stop_text, ctx):
    model.eval()
    prompt_ids = tok.encode(prompt).ids
    ids = list(prompt_ids)
    for _ in range(max_new):
        x = torch.tensor([ids[-ctx:]], device="cuda")
        logits = model(input_ids=x, use_cache=False).logits[0, -1].float()
        if temperature <= 0:
            nxt = int(logits.argmax())
        else:
            vals, cand = (logits / temperature).topk(top_k)
            nxt = int(cand[torch.multinomial(vals.softmax(-1), 1, generator=gen)])
        ids.append(nxt)
        if nxt in stop_ids:
            break
        if stop_text and tok.decode(ids[len(prompt_ids):], skip_special_tokens=False).endswith(stop_text):
            break
    return tok.decode(ids[len(prompt_ids):], skip_special_tokens=False)


PROMPTS = [
    ("plain", "The meaning of life is"),
    ("plain", "Once upon a time"),
    ("plain", "A good friend"),
    ("plain", "happiness (noun):"),
    ("plain", "computer:"),
    ("chat", 'What does "courage" mean?'),
    ("chat", "Tell me a fortune."),
]


def samples(model, tok, args, ids):
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    out = []
    for kind, prompt in PROMPTS:
        if kind == "plain":
            text = generate(model, tok, prompt, 16 if args.smoke else 80, 0.8, 40, gen, set(ids.values()),
                            "\n\n", args.ctx)
            out.append({"prompt": prompt, "completion": text})
        else:
            text = generate(model, tok, chatml(prompt, "")[: -len("<|im_end|>\n")], 16 if args.smoke else 80,
                            0.8, 40, gen, {ids["<|im_end|>"], ids["<|endoftext|>"]}, None, args.ctx)
            out.append({"chat_user": prompt, "assistant": text})
    return out


# ------------------------------------------------------------------ export

def canonical_state(model, tied):
    """The state dict in the Hugging Face hub layout of Qwen3-MoE checkpoints
    (what converters expect): one gate/up/down_proj per expert, float16."""
    out = {}
    for name, t in model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue
        m = re.match(r"(.*\.mlp\.experts)\.gate_up_proj$", name)
        if m:
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{m.group(1)}.{e}.gate_proj.weight"] = t[e, :inter]
                out[f"{m.group(1)}.{e}.up_proj.weight"] = t[e, inter:]
            continue
        m = re.match(r"(.*\.mlp\.experts)\.down_proj$", name)
        if m:
            for e in range(t.shape[0]):
                out[f"{m.group(1)}.{e}.down_proj.weight"] = t[e]
            continue
        out[name] = t
    return {k: v.detach().to(torch.float16).contiguous().cpu() for k, v in out.items()}


def export(model, tied, layout_known, args, export_dir):
    """Writes export_dir: model.safetensors (float16), config.json,
    tokenizer files. Returns notes for the summary."""
    from safetensors.torch import save_file

    shutil.rmtree(export_dir, ignore_errors=True)
    os.makedirs(export_dir)
    notes = {}
    if layout_known:
        tensors = canonical_state(model, tied)
        save_file(tensors, os.path.join(export_dir, "model.safetensors"), metadata={"format": "pt"})
        model.config.save_pretrained(export_dir)
        notes["layout"] = "per-expert (model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight)"
    else:
        model.to(torch.float16).save_pretrained(export_dir)
        model.float()
        notes["layout"] = "as transformers saves it"
    path = os.path.join(export_dir, "config.json")
    with open(path) as f:
        plain = json.load(f)
    patched = dict(plain)
    patched.setdefault("architectures", ["Qwen3MoeForCausalLM"])
    patched["head_dim"] = 64
    patched["rope_theta"] = args.rope_theta
    patched["use_cache"] = True
    dtype_key = "dtype" if "dtype" in patched else "torch_dtype"
    patched[dtype_key] = "float16"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(args.tokenizer, name), export_dir)
    with open(path, "w") as f:
        json.dump(patched, f, indent=2, sort_keys=True)
    notes["config_keys_added"] = ["head_dim", "rope_theta"]
    return notes, plain


def reload_check(export_dir, plain_config, corpus, args):
    """Loads the export with from_pretrained (fp32) and evaluates it. If the
    patched config.json is refused, the plain one is restored and tried."""
    from transformers import Qwen3MoeForCausalLM

    path = os.path.join(export_dir, "config.json")
    for attempt in ("patched", "plain"):
        try:
            if attempt == "plain":
                with open(path, "w") as f:
                    json.dump(plain_config, f, indent=2, sort_keys=True)
            m = Qwen3MoeForCausalLM.from_pretrained(export_dir).float().cuda()
            force_eager_experts(m)
            nll, scored, n_win = window_nll(m, corpus.held, args.eval_ctx, max_windows=20 if args.smoke else 0)
            del m
            return {"config": attempt, "heldout_nll": nll, "heldout_ppl": math.exp(nll)}
        except Exception as exc:  # noqa: BLE001
            log(f"reload with the {attempt} config.json failed: {type(exc).__name__}: {exc}")
    return {"config": None, "error": "the export could not be reloaded"}


def pack(out_dir, export_dir, extra_files):
    """One deterministic tar of the export and the logs, cut into parts."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        names = [(os.path.join(export_dir, n), "demo-moe/" + n) for n in sorted(os.listdir(export_dir))]
        names += [(p, "demo-moe/" + os.path.basename(p)) for p in extra_files]
        for src, arc in names:
            info = tar.gettarinfo(src, arcname=arc)
            info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode = 0, 0, 0, "", "", 0o644
            with open(src, "rb") as f:
                tar.addfile(info, f)
    data = buf.getvalue()
    for old in os.listdir(out_dir):
        if old.startswith("demo-moe.tar.part"):
            os.remove(os.path.join(out_dir, old))
    parts = []
    for i in range(0, len(data), PART_BYTES):
        p = os.path.join(out_dir, f"demo-moe.tar.part{i // PART_BYTES:02d}")
        with open(p, "wb") as f:
            f.write(data[i:i + PART_BYTES])
        parts.append(os.path.basename(p))
    return {"tar_bytes": len(data), "tar_sha256": hashlib.sha256(data).hexdigest(), "parts": parts}


# ------------------------------------------------------------------ training

LOG_FIELDS = ["run", "epochs", "step", "max_steps", "epoch", "tokens", "lr", "train_loss", "aux_loss", "grad_norm",
              "val_loss", "tok_per_s", "elapsed_s"]


def lr_at(step, max_steps, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    frac = min(1.0, (step - args.warmup) / max(1, max_steps - args.warmup))
    return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * frac)))


def make_optimizer(model, args):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    try:
        return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    except (TypeError, RuntimeError):
        return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8)


def save_ckpt(path, state):
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def train_all(args, model, tap, corpus, log_path, ckpt_path):
    """Runs the epoch sweep; returns (best state dict on CPU, sweep results,
    run index of the best)."""
    spe = corpus.steps_per_epoch(args.ctx, args.batch)
    if spe == 0:
        raise SystemExit("train_demo: the corpus is smaller than one batch")
    init_state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    budget = args.max_minutes * 60.0
    st = {"run": 0, "step": 0, "results": [], "best_state": None, "best_val": float("inf"), "best_run": -1,
          "elapsed": 0.0, "max_steps": None}
    opt = make_optimizer(model, args)
    if args.resume and os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        if ck["model_args"] != model_args(args):
            raise SystemExit("train_demo: --resume: the checkpoint was made with other settings")
        st = ck["state"]
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        torch.set_rng_state(ck["rng_cpu"])
        torch.cuda.set_rng_state(ck["rng_cuda"])
        log(f"resumed run {st['run']} at step {st['step']} ({st['elapsed']:.0f} s of training done)")
    elif os.path.exists(log_path):
        os.remove(log_path)
    new_log = not os.path.exists(log_path)
    logf = open(log_path, "a", newline="")
    writer = csv.DictWriter(logf, fieldnames=LOG_FIELDS)
    if new_log:
        writer.writeheader()

    t_start = time.time() - st["elapsed"]
    last_ckpt = time.time()
    steps_done_here = 0
    while st["run"] < len(args.epoch_list):
        run, epochs = st["run"], args.epoch_list[st["run"]]
        if st["max_steps"] is None:
            st["max_steps"] = args.max_steps or max(args.warmup + 1, int(epochs * spe))
            st["fixed"] = bool(args.max_steps)
            st["run_best_val"], st["run_best_state"], st["run_best_step"] = float("inf"), None, 0
            left = budget - (time.time() - t_start)
            if run > 0 and left < 30:
                log(f"run {run} ({epochs:g} epochs) skipped: {left:.0f} s of the budget left")
                st["results"].append({"run": run, "epochs": epochs, "skipped": True})
                st["run"] += 1
                st["max_steps"] = None
                continue
            if st["step"] == 0 and run > 0:
                model.load_state_dict(init_state)
                opt = make_optimizer(model, args)
                torch.manual_seed(args.seed)
            log(f"run {run}: {epochs:g} epochs = {st['max_steps']} steps of {args.batch} x {args.ctx} tokens "
                f"({spe} steps per epoch)")
        max_steps = st["max_steps"]
        val_every = args.val_every or max(10, max_steps // 20)
        run_t0 = time.time()
        run_step0 = st["step"]
        val_spent = 0.0
        acc_loss = torch.zeros((), device="cuda")
        acc_aux = torch.zeros((), device="cuda")
        acc_n, t_log, tok_log = 0, time.time(), 0
        epoch_idx = st["step"] // spe
        seqs = corpus.epoch(args.seed, epoch_idx, args.ctx, args.batch).cuda()
        model.train()
        while st["step"] < max_steps:
            step = st["step"]
            if step // spe != epoch_idx:
                epoch_idx = step // spe
                seqs = corpus.epoch(args.seed, epoch_idx, args.ctx, args.batch).cuda()
            b = step % spe
            batch = seqs[b * args.batch:(b + 1) * args.batch]
            x, y = batch[:, :-1].contiguous(), batch[:, 1:].contiguous()
            lr = lr_at(step, max_steps, args)
            for group in opt.param_groups:
                group["lr"] = lr
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(input_ids=x, use_cache=False).logits
            ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
            aux = tap.balance_loss()
            loss = ce + args.aux_coef * aux
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            opt.step()
            acc_loss += ce.detach()
            acc_aux += aux.detach() if torch.is_tensor(aux) else aux
            acc_n += 1
            tok_log += x.numel()
            st["step"] = step = step + 1
            steps_done_here += 1

            # Time steps 5 to 25 of this run (past the first steps' set-up
            # costs, before the first validation), then fit the schedule.
            if step - run_step0 == 5 and not st.get("fixed"):
                torch.cuda.synchronize()
                t_probe, val_at_probe = time.time(), val_spent
            if step - run_step0 == 25 and not st.get("fixed"):
                torch.cuda.synchronize()
                per_step = (time.time() - t_probe - (val_spent - val_at_probe)) / 20
                runs_left = len(args.epoch_list) - run - 1
                left = budget - (time.time() - t_start)
                # Later runs are longer: reserve them their share by epochs.
                later = sum(args.epoch_list[run + 1:])
                share = left * (epochs / (epochs + later)) if runs_left else left
                fit = step + int(0.95 * share / per_step)
                if fit < max_steps:
                    log(f"run {run}: {per_step * 1000:.1f} ms a step; schedule shortened from {max_steps} to {fit} "
                        f"steps to fit the budget (reproduce with --epochs {epochs:g} --max-steps {fit})")
                    st["max_steps"] = max_steps = max(fit, step + 1)
                    val_every = args.val_every or max(10, max_steps // 20)
                else:
                    log(f"run {run}: {per_step * 1000:.1f} ms a step; {max_steps} steps fit the budget "
                        f"({share:.0f} s of {left:.0f} s left are this run's)")
                st["fixed"] = True

            val = None
            if step % val_every == 0 or step == max_steps:
                t_val = time.time()
                val, _, _ = window_nll(model, corpus.val, args.eval_ctx, max_windows=20 if args.smoke else 0)
                val_spent += time.time() - t_val
                if val < st["run_best_val"]:
                    st["run_best_val"], st["run_best_step"] = val, step
                    st["run_best_state"] = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
            if step % args.log_every == 0 or val is not None or step == max_steps:
                torch.cuda.synchronize()
                now = time.time()
                row = {"run": run, "epochs": epochs, "step": step, "max_steps": max_steps,
                       "epoch": f"{step / spe:.3f}", "tokens": step * args.batch * args.ctx, "lr": f"{lr:.3e}",
                       "train_loss": f"{(acc_loss / max(acc_n, 1)).item():.4f}",
                       "aux_loss": f"{(acc_aux / max(acc_n, 1)).item():.4f}", "grad_norm": f"{gnorm.item():.3f}",
                       "val_loss": "" if val is None else f"{val:.4f}",
                       "tok_per_s": f"{tok_log / max(now - t_log, 1e-9):.0f}", "elapsed_s": f"{now - t_start:.1f}"}
                writer.writerow(row)
                logf.flush()
                if step % (args.log_every * 5) == 0 or val is not None or step == max_steps:
                    log("run {run} step {step}/{max_steps} ep {epoch} loss {train_loss} aux {aux_loss} "
                        "gnorm {grad_norm} val {val_loss} lr {lr} {tok_per_s} tok/s".format(**row))
                acc_loss.zero_()
                acc_aux.zero_()
                acc_n, t_log, tok_log = 0, now, 0

            st["elapsed"] = time.time() - t_start
            out_of_time = st["elapsed"] > budget
            stopping = args.stop_after and steps_done_here >= args.stop_after
            if time.time() - last_ckpt > args.ckpt_every_s or out_of_time or stopping:
                save_ckpt(ckpt_path, {"state": st, "model": model.state_dict(), "optimizer": opt.state_dict(),
                                      "rng_cpu": torch.get_rng_state(), "rng_cuda": torch.cuda.get_rng_state(),
                                      "model_args": model_args(args)})
                last_ckpt = time.time()
            if stopping:
                log(f"--stop-after {args.stop_after}: checkpoint saved at step {step}; exiting")
                logf.close()
                sys.exit(0)
            if out_of_time:
                log(f"run {run}: wall-clock budget of {args.max_minutes:g} min reached at step {step}")
                break

        res = {"run": run, "epochs": epochs, "steps": st["step"], "planned_steps": max_steps,
               "best_val": st["run_best_val"], "best_step": st["run_best_step"],
               "train_seconds": round(time.time() - run_t0, 1)}
        st["results"].append(res)
        log(f"run {run} done: best validation NLL {res['best_val']:.4f} at step {res['best_step']}")
        if st["run_best_val"] < st["best_val"]:
            st["best_val"], st["best_run"], st["best_state"] = st["run_best_val"], run, st["run_best_state"]
        st["run_best_state"] = None
        st["run"] += 1
        st["step"], st["max_steps"] = 0, None
        if st["elapsed"] > budget and st["run"] < len(args.epoch_list):
            for r in range(st["run"], len(args.epoch_list)):
                st["results"].append({"run": r, "epochs": args.epoch_list[r], "skipped": True})
            st["run"] = len(args.epoch_list)
    logf.close()
    save_ckpt(ckpt_path, {"state": st, "model": model.state_dict(), "optimizer": opt.state_dict(),
                          "rng_cpu": torch.get_rng_state(), "rng_cuda": torch.cuda.get_rng_state(),
                          "model_args": model_args(args)})
    return st["best_state"], st["results"], st["best_run"]


def model_args(args):
    keys = ["seed", "layers", "hidden", "heads", "kv_heads", "experts", "top_k", "expert_ff", "ctx", "rope_theta",
            "epoch_list", "batch", "lr", "min_lr_frac", "warmup", "weight_decay", "dropout", "aux_coef", "smoke",
            "no_chat", "max_steps"]
    return {k: getattr(args, k) for k in keys}


# ------------------------------------------------------------------ main

def main():
    args = parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("train_demo: needs a CUDA GPU")
    import tokenizers
    import transformers
    from tokenizers import Tokenizer

    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(args.seed)
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "tokenizers": tokenizers.__version__, "gpu": torch.cuda.get_device_name(0)}
    log("versions: " + json.dumps(versions))

    tok = Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json"))
    vocab = tok.get_vocab_size(with_added_tokens=True)
    special = {s: tok.token_to_id(s) for s in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")}
    corpus = Corpus(args, tok)
    log("corpus: " + json.dumps(corpus.counts))
    if corpus.held_per_doc_tokens != corpus.held.numel():
        log(f"note: heldout tokenized whole = {corpus.held.numel()} tokens, per document = "
            f"{corpus.held_per_doc_tokens} (the file ends in one newline, not two)")

    model, tied = build_model(args, vocab, special["<|im_end|>"], special["<|endoftext|>"])
    params = count_params(model, tied)
    log(f"model: {json.dumps(params)}; attention: {getattr(model.config, '_attn_implementation', '?')}")
    model.cuda()
    impl, layout_known = install_experts(model, args)
    tap = RouterTap(model, args.experts, args.top_k)
    add_dropout(model, args.dropout)

    log_path = os.path.join(args.work, "train_log.csv")
    ckpt_path = os.path.join(args.work, "ckpt.pt")
    t_train = time.time()
    best_state, results, best_run = train_all(args, model, tap, corpus, log_path, ckpt_path)
    train_seconds = time.time() - t_train
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()

    # Held-out evaluation (fp32), with expert usage counted on the way.
    tap.counting = True
    held_nll, scored, n_win = window_nll(model, corpus.held, args.eval_ctx, max_windows=20 if args.smoke else 0)
    tap.counting = False
    share = (tap.counts / tap.counts.sum(dim=1, keepdim=True)).numpy()
    usage = {"min_share": float(share.min()), "max_share": float(share.max()), "uniform": 1.0 / args.experts,
             "per_layer": [[round(float(v), 4) for v in row] for row in share]}
    val_nll, _, _ = window_nll(model, corpus.val, args.eval_ctx, max_windows=20 if args.smoke else 0)
    log(f"held-out: NLL {held_nll:.4f}, perplexity {math.exp(held_nll):.3f} over {scored} tokens "
        f"({n_win} windows of {args.eval_ctx}); validation NLL {val_nll:.4f}")
    log(f"expert usage on held-out: share per expert between {usage['min_share']:.3f} and "
        f"{usage['max_share']:.3f} (uniform {usage['uniform']:.4f})")

    sample_out = samples(model, tok, args, special)
    for s in sample_out:
        log("sample: " + json.dumps(s, ensure_ascii=False))

    f32_dir = os.path.join(args.work, "final-f32")
    try:
        model.save_pretrained(f32_dir)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(args.tokenizer, name), f32_dir)
        f32_note = "saved"
    except Exception as exc:  # noqa: BLE001
        f32_note = f"save_pretrained failed: {type(exc).__name__}: {exc}"
        log(f32_note)
    export_dir = os.path.join(args.work, "demo-moe")
    notes, plain_config = export(model, tied, layout_known, args, export_dir)
    reload = reload_check(export_dir, plain_config, corpus, args)
    log("export reloaded: " + json.dumps(reload))

    with open(os.path.join(args.tokenizer, "tokenizer.json"), "rb") as f:
        tok_sha = hashlib.sha256(f.read()).hexdigest()
    summary = {
        "versions": versions,
        "model": {"architecture": "qwen3moe (Qwen3MoeForCausalLM)", "layers": args.layers, "hidden": args.hidden,
                  "heads": args.heads, "kv_heads": args.kv_heads, "head_dim": 64, "experts": args.experts,
                  "experts_per_token": args.top_k, "moe_intermediate_size": args.expert_ff, "norm_topk_prob": True,
                  "rope_theta": args.rope_theta, "context": args.ctx, "vocab": vocab, **params},
        "training": {"epochs_sweep": args.epoch_list, "runs": results, "chosen_run": best_run,
                     "batch": [args.batch, args.ctx], "lr": args.lr, "min_lr_frac": args.min_lr_frac,
                     "warmup": args.warmup, "weight_decay": args.weight_decay, "dropout": args.dropout,
                     "aux_coef": args.aux_coef, "experts_path": impl, "seed": args.seed,
                     "train_seconds": round(train_seconds, 1), "max_minutes": args.max_minutes},
        "corpus": {**corpus.counts, "sha256": corpus.sha, "tokenizer_json_sha256": tok_sha},
        "heldout": {"nll": held_nll, "perplexity": math.exp(held_nll), "scored_tokens": scored, "windows": n_win,
                    "ctx": args.eval_ctx, "recipe": "moe perplexity -f heldout.txt --ctx 256"},
        "validation_nll": val_nll,
        "expert_usage": usage,
        "export": {**notes, "f32": f32_note, "reload": reload},
        "samples": sample_out,
        "smoke": args.smoke,
    }
    paths = {}
    for name in ("summary.json", "samples.txt", "train_log.csv"):
        paths[name] = os.path.join(args.work, name)
    with open(paths["samples.txt"], "w", encoding="utf-8") as f:
        for s in sample_out:
            if "prompt" in s:
                f.write(f"### prompt: {s['prompt']}\n{s['prompt']}{s['completion']}\n\n")
            else:
                f.write(f"### chat, user: {s['chat_user']}\n{s['assistant']}\n\n")
    with open(paths["summary.json"], "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2, ensure_ascii=False)
    packed = pack(args.out, export_dir, [paths[n] for n in ("summary.json", "samples.txt", "train_log.csv")])
    for p in paths.values():
        shutil.copy(p, args.out)
    log("packed: " + json.dumps(packed))
    print("\n=== demo model summary ===")
    print(f"model      qwen3moe, {params['total'] / 1e6:.2f} M parameters ({args.layers} layers, hidden {args.hidden}, "
          f"{args.experts} experts top-{args.top_k}, ff {args.expert_ff}, vocab {vocab})")
    for r in results:
        print("run        " + json.dumps(r))
    print(f"chosen     run {best_run}; training {train_seconds:.0f} s")
    print(f"held-out   NLL {held_nll:.4f}  perplexity {math.exp(held_nll):.3f}  ({scored} tokens, {n_win} x {args.eval_ctx})")
    print(f"reloaded   {json.dumps(reload)}")
    print(f"experts    share per expert {usage['min_share']:.3f}..{usage['max_share']:.3f} (uniform {usage['uniform']:.4f})")
    print(f"files      {', '.join(packed['parts'])} ({packed['tar_bytes']} bytes, sha256 {packed['tar_sha256'][:16]}...)")


if __name__ == "__main__":
    main()
