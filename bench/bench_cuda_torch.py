#!/usr/bin/env python3
"""PyTorch baseline of bench_cuda: the same Llama training step on the same GPU.

A plain Llama (RMSNorm, rotate-half RoPE, GQA, SwiGLU, tied or untied head) written with
torch ops, fp32 master weights under bf16 autocast, F.scaled_dot_product_attention (flash
attention on the H200), torch.optim.AdamW(fused=True). Weights are drawn as autosp's llama_init draws them (normal,
std initializer_range; norms 1), so both sides start near loss ln(V); the values differ.
The model is built on the device (no host init). Checkpoint policies: none, and full (every
decoder layer under torch.utils.checkpoint, non-reentrant). Memory is
torch.cuda.max_memory_allocated (what the caching allocator handed out at its peak).

  bench_cuda_torch.py --config CONFIG.json --seq-len S [--steps N] [--checkpoint none|full]
                      [--max-seq] --out FILE.json

--max-seq: doubling S from --seq-len, one training step each (one model and optimizer for
every S), until CUDA runs out of memory; reports the longest S that trained.
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


class RMSNorm(torch.nn.Module):
    def __init__(self, h, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(h))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight.to(x.dtype)


def rope_tables(S, D, theta, device):
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, device=device, dtype=torch.float32) / D))
    ang = torch.arange(S, device=device, dtype=torch.float32)[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class Layer(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        H, self.NH, self.NKV = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
        self.D = c.get("head_dim") or H // self.NH
        F_ = c["intermediate_size"]
        self.q = torch.nn.Linear(H, self.NH * self.D, bias=False)
        self.k = torch.nn.Linear(H, self.NKV * self.D, bias=False)
        self.v = torch.nn.Linear(H, self.NKV * self.D, bias=False)
        self.o = torch.nn.Linear(self.NH * self.D, H, bias=False)
        self.gate = torch.nn.Linear(H, F_, bias=False)
        self.up = torch.nn.Linear(H, F_, bias=False)
        self.down = torch.nn.Linear(F_, H, bias=False)
        self.n1 = RMSNorm(H, c["rms_norm_eps"])
        self.n2 = RMSNorm(H, c["rms_norm_eps"])

    def forward(self, x, cos, sin):
        B, S, _ = x.shape
        h = self.n1(x)
        q = self.q(h).view(B, S, self.NH, self.D).transpose(1, 2)
        k = self.k(h).view(B, S, self.NKV, self.D).transpose(1, 2)
        v = self.v(h).view(B, S, self.NKV, self.D).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.NH // self.NKV
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(B, S, self.NH * self.D))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(torch.nn.Module):
    def __init__(self, c, full_checkpoint):
        super().__init__()
        self.c = c
        self.embed = torch.nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = torch.nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.tied = c.get("tie_word_embeddings", False)
        if not self.tied:
            self.head = torch.nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        self.full_checkpoint = full_checkpoint
        std = c.get("initializer_range", 0.02)
        for m in self.modules():
            if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)):
                torch.nn.init.normal_(m.weight, 0.0, std)

    def forward(self, ids, labels):
        S = ids.shape[1]
        D = self.c.get("head_dim") or self.c["hidden_size"] // self.c["num_attention_heads"]
        cos, sin = rope_tables(S, D, self.c.get("rope_theta", 10000.0), ids.device)
        x = self.embed(ids)
        for layer in self.layers:
            x = checkpoint(layer, x, cos, sin, use_reentrant=False) if self.full_checkpoint else layer(x, cos, sin)
        x = self.norm(x)
        w = self.embed.weight if self.tied else self.head.weight
        logits = x @ w.to(x.dtype).t()
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100)


def model_flops(c, B, S, params):
    V, H = c["vocab_size"], c["hidden_size"]
    D = c.get("head_dim") or H // c["num_attention_heads"]
    matmul = params - V * H + (V * H if c.get("tie_word_embeddings", False) else 0)
    attn_fwd = 2 * 2 * B * S * S * D * c["num_attention_heads"] * c["num_hidden_layers"] * 0.5
    return 6 * matmul * B * S + 3 * attn_fwd  # as bench_cuda.cpp's model_flops


def make_model(c, policy, dev):
    torch.manual_seed(42)
    with torch.device(dev):
        model = Llama(c, policy == "full")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    return model, opt


def one_run(model, opt, c, S, B, steps, dev):
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    g = torch.Generator(device=dev).manual_seed(1)
    ids = torch.randint(0, c["vocab_size"], (B, S + 1), device=dev, generator=g)
    times, losses = [], []
    for step in range(steps + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(ids[:, :-1], ids[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        losses.append(float(loss.detach()))
        if step > 0:
            times.append(dt)
        print(f"torch S {S} step {step}: {dt:.3f} s, loss {losses[-1]:.4f}", flush=True)
    params = sum(p.numel() for p in model.parameters())
    peak = torch.cuda.max_memory_allocated()
    first = times[0] if times else dt
    times.sort()
    return {"step_seconds": times[len(times) // 2] if times else 0.0, "first_step_seconds": first,
            "peak_bytes": peak, "losses": losses, "parameters": params}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--checkpoint", choices=["none", "full"], default="none")
    ap.add_argument("--max-seq", action="store_true")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    c = json.load(open(a.config))
    dev = torch.device("cuda")
    result = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "checkpoint": a.checkpoint,
              "batch": a.batch}
    model, opt = make_model(c, a.checkpoint, dev)
    if a.max_seq:
        best, tried, S = 0, [], a.seq_len
        while S <= (1 << 22):
            try:
                r = one_run(model, opt, c, S, a.batch, 0, dev)
                tried.append({"seq_len": S, "peak_bytes": r["peak_bytes"], "step_seconds": r["first_step_seconds"]})
                best = S
                S *= 2
            except torch.cuda.OutOfMemoryError:
                tried.append({"seq_len": S, "oom": True})
                break
        opt.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        result["max_seq"] = {"seq_len": best, "tried": tried, "step_run": True}
    else:
        r = one_run(model, opt, c, a.seq_len, a.batch, a.steps, dev)
        result.update(r)
        result["seq_len"] = a.seq_len
        result["model_flops"] = model_flops(c, a.batch, a.seq_len, r["parameters"])
        result["mfu"] = result["model_flops"] / r["step_seconds"] / (a.peak_tflops * 1e12) if r["step_seconds"] else 0
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps({k: v for k, v in result.items() if k != "losses"}))


if __name__ == "__main__":
    main()
