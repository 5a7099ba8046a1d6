#!/usr/bin/python3
"""The PyTorch baselines of bench_train.py: float32 training steps of the Llama autosp trains.

Usage:
  /usr/bin/python3 bench/torch_llama_step.py --model DIR --config DS.json --data tokens.bin
      --seq-len S --steps N [--threads T] [--seed K] [--impl eager|hf-sdpa]

--impl eager (the default; Debian's torch 1.13): the module below.
--impl hf-sdpa (torch 2.x with transformers, from scripts/install_bench_venv.sh): what people
run (issue 25): transformers' LlamaForCausalLM with attn_implementation="sdpa" (causal
scaled_dot_product_attention, no S x S tensor on the CPU's flash kernel), float32, given the
eager module's weights (built as --impl eager builds them, then copied by name), so both
sides start from the same weights where torch's seeded normal_ draws the same numbers. Before
timing it checks itself: the eager module's loss on the first sample (forward only, same
process) against its own step-1 loss ("loss_eager_same_weights" in the JSON).

Same semantics as autosp's Llama (tests/reference/llama_reference.py is the float64 check of
those): embedding, per layer RMSNorm -> q/k/v/o with rotate-half RoPE and causal GQA
attention -> residual, RMSNorm -> SwiGLU MLP -> residual; final RMSNorm, lm_head (or the
tied embedding), mean cross-entropy; AdamW and clip_grad_norm_ with the DeepSpeed config's
parameters. Attention is written the way Hugging Face's eager LlamaAttention writes it
(torch 1.13 has no scaled_dot_product_attention): matmul, additive causal mask, softmax in
float32, matmul; repeat_kv by expand + reshape.

Sample k of the token file is tokens [k*S, k*S+S+1), as in autosp; step i trains on sample
i-1 (micro batch 1, no accumulation: bench_train.py only uses that). Init is seeded but not
autosp's (the benchmark compares time and memory; the loss is only a sanity check).

--steps 0 stops after imports, model and optimizer construction and reading the data: the
idle baseline whose resident set the driver subtracts.

Prints one JSON object on stdout: step_time_s per step, the median over the steps after the
first (the first pays one-time allocation), loss per step, peak resident set (VmHWM), and the
weights' float64 sum and sum of squares ("weights_sum", "weights_sumsq": the same on both
implementations when their weights are).
"""
import argparse
import json
import math
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def vm_hwm_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


class RMSNorm(nn.Module):
    def __init__(self, h, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h))
        self.eps = eps

    def forward(self, x):
        # y = x / sqrt(mean(x^2) + eps) * w
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.nh, self.nkv = c["num_attention_heads"], c["num_key_value_heads"]
        self.d = c.get("head_dim") or c["hidden_size"] // self.nh
        h = c["hidden_size"]
        self.q_proj = nn.Linear(h, self.nh * self.d, bias=False)
        self.k_proj = nn.Linear(h, self.nkv * self.d, bias=False)
        self.v_proj = nn.Linear(h, self.nkv * self.d, bias=False)
        self.o_proj = nn.Linear(self.nh * self.d, h, bias=False)

    def forward(self, x, cos, sin, mask):
        B, S, _ = x.shape
        q = self.q_proj(x).view(B, S, self.nh, self.d).transpose(1, 2)
        k = self.k_proj(x).view(B, S, self.nkv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(B, S, self.nkv, self.d).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.nh // self.nkv
        k = k[:, :, None].expand(B, self.nkv, rep, S, self.d).reshape(B, self.nh, S, self.d)
        v = v[:, :, None].expand(B, self.nkv, rep, S, self.d).reshape(B, self.nh, S, self.d)
        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.d)
        w = w + mask
        w = F.softmax(w, dim=-1, dtype=torch.float32)
        o = torch.matmul(w, v).transpose(1, 2).reshape(B, S, self.nh * self.d)
        return self.o_proj(o)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, f = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(h, f, bias=False)
        self.up_proj = nn.Linear(h, f, bias=False)
        self.down_proj = nn.Linear(f, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = MLP(c)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        if c.get("rope_scaling"):
            sys.exit("torch_llama_step.py: rope_scaling is not implemented here; "
                     "bench_train.py writes configs without it")
        self.c = c
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.tied = bool(c.get("tie_word_embeddings", False))
        if not self.tied:
            self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        d = self.layers[0].self_attn.d
        self.inv_freq = 1.0 / (c.get("rope_theta", 10000.0)
                               ** (torch.arange(0, d, 2, dtype=torch.float32) / d))

    def forward(self, ids):
        S = ids.shape[1]
        pos = torch.arange(S, dtype=torch.float32)
        freqs = torch.outer(pos, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        mask = torch.full((S, S), torch.finfo(torch.float32).min).triu(1)[None, None]
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        x = self.norm(x)
        w = self.embed_tokens.weight if self.tied else self.lm_head.weight
        return F.linear(x, w)


def hf_sdpa_model(model_dir, eager):
    """transformers' LlamaForCausalLM with SDPA attention in float32, holding eager's weights."""
    import transformers
    cfg = transformers.AutoConfig.from_pretrained(model_dir)
    hf = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    if hf.config._attn_implementation != "sdpa":
        sys.exit(f"torch_llama_step.py: transformers {transformers.__version__} made a model with "
                 f"attn_implementation {hf.config._attn_implementation!r}, not 'sdpa'")
    hf.float()
    # The eager module's names are Hugging Face's without the "model." of the decoder.
    state = {(k if k.startswith("lm_head.") else "model." + k): v
             for k, v in eager.state_dict().items()}
    hf.load_state_dict(state, strict=True)
    hf.config.use_cache = False
    return hf


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="directory with a HF config.json")
    ap.add_argument("--config", required=True, help="DeepSpeed JSON (optimizer, clipping)")
    ap.add_argument("--data", required=True, help="little-endian uint32 token file")
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--impl", choices=("eager", "hf-sdpa"), default="eager",
                    help="eager: the module here (HF's eager attention); hf-sdpa: transformers' "
                         "LlamaForCausalLM with SDPA (torch 2.x), the same weights")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    with open(f"{a.model}/config.json") as f:
        c = json.load(f)
    with open(a.config) as f:
        ds = json.load(f)
    if ds.get("train_micro_batch_size_per_gpu", 1) != 1 or \
            ds.get("gradient_accumulation_steps", 1) != 1:
        sys.exit("torch_llama_step.py: only micro batch 1 without accumulation")

    model = Llama(c)
    # HF init: normal(0, initializer_range) for linear and embedding weights, norms ones.
    std = c.get("initializer_range", 0.02)
    for name, p in model.named_parameters():
        if not name.endswith("norm.weight"):
            nn.init.normal_(p, 0.0, std)
    eager = model
    if a.impl == "hf-sdpa":
        model = hf_sdpa_model(a.model, eager)
    op = ds["optimizer"]["params"]
    opt = torch.optim.AdamW(model.parameters(), lr=op.get("lr", 1e-3),
                            betas=tuple(op.get("betas", (0.9, 0.999))),
                            eps=op.get("eps", 1e-8), weight_decay=op.get("weight_decay", 0.01))
    clip = ds.get("gradient_clipping", 0.0)

    S = a.seq_len
    tokens = np.fromfile(a.data, dtype="<u4")
    n_samples = (len(tokens) - 1) // S
    if n_samples < 1:
        sys.exit(f"torch_llama_step.py: {a.data} has {len(tokens)} tokens, need {S + 1}")

    def sample(k):
        chunk = torch.from_numpy(tokens[k * S:k * S + S + 1].astype(np.int64))
        return chunk[:-1][None], chunk[1:][None]

    with torch.no_grad():
        params = [p.detach().double() for p in model.parameters()]
        weights_sum = float(sum(p.sum() for p in params))
        weights_sumsq = float(sum((p * p).sum() for p in params))
        del params
    loss_eager = None
    if a.impl != "eager" and a.steps > 0:
        with torch.no_grad():
            ids, labels = sample(0)
            logits = eager(ids)
            loss_eager = F.cross_entropy(logits.view(-1, logits.shape[-1]),
                                         labels.reshape(-1)).item()
            del logits
    del eager

    def logits_of(ids):
        if a.impl == "eager":
            return model(ids)
        return model(input_ids=ids, use_cache=False).logits

    times, losses = [], []
    for step in range(a.steps):
        ids, labels = sample(step % n_samples)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = logits_of(ids)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.reshape(-1))
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        loss_value = loss.item()
        del logits, loss
        times.append(time.perf_counter() - t0)
        losses.append(loss_value)

    after_first = times[1:] if len(times) > 1 else times
    print(json.dumps({
        "seq_len": S, "threads": a.threads, "steps": a.steps,
        "step_time_s": times, "median_step_time_s":
            statistics.median(after_first) if after_first else None,
        "loss": losses, "peak_rss_bytes": vm_hwm_bytes(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "torch": torch.__version__, "impl": a.impl, "cpu_capability": cpu_capability(),
        "weights_sum": weights_sum, "weights_sumsq": weights_sumsq,
        "loss_eager_same_weights": loss_eager,
    }))


def cpu_capability():
    """The kernel set torch's own CPU kernels dispatch to ("AVX2", "AVX512", ...): what
    ATEN_CPU_CAPABILITY asked for, if torch honoured it. torch.__config__.show() says it in 1.13
    and 2.x alike; None if it does not."""
    for line in torch.__config__.show().splitlines():
        if "CPU capability usage:" in line:
            return line.split(":", 1)[1].strip()
    return None


if __name__ == "__main__":
    main()
