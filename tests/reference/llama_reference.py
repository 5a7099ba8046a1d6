#!/usr/bin/python3
"""Float64 reference of one small autosp training run (llm.c test_gpt2 style).

Usage:
  /usr/bin/python3 tests/reference/llama_reference.py --out DIR
      [--tied 0|1] [--rope llama3|default|yarn] [--steps N] [--seed K] [--seq-len S] [--accum G]
      [--eos ID] [--sample-order K0,K1,... --data-seed SEED]

--seq-len and --accum (defaults 16 and 2) change S and the micro batches per step: a
single device with accumulation G sees the samples that D data-parallel ranks with
accumulation G / D see (tests/sp, tests/train/zero_test.cpp), so one float64 run is the
reference for every layout of the same global batch.

--eos ID packs documents (DESIGN.md "Files users bring"): token ID ends a document in
tokens.bin (documents of 1 to 2S tokens, so some are cut by a sample's start or end and some
hold several per sample), ds_config.json gets "data": {"eos_token_id": ID}, and training
restarts position ids at each document start (a document cut by the sample's start
continues its own count), gives a document's last token no label, and masks attention to
the causal part of each token's own document.

--sample-order K0,K1,... reads global sample g (the g-th sample the run reads, counted as
below) from file sample K_g: the order autosp's shuffle gives (train::shuffled_sample,
computed by the caller, not here), and ds_config.json gets "data": {"shuffle": true,
"seed": SEED}. Without it, ds_config.json says "data": {"shuffle": false} and g reads file
sample g mod the number of samples.

Writes into DIR the files a user brings (DESIGN.md "Files users bring") and what autosp must
reproduce from them:
  config.json           Hugging Face LlamaForCausalLM config of a tiny GQA model
  model.safetensors     its initial parameters, F32, Hugging Face names
  tokens.bin            13*S + 1 little-endian uint32 token ids (S = 16)
  ds_config.json        DeepSpeed config: micro batch 2, accumulation 2, clipping 1.0,
                        AdamW, WarmupLR (linear)
  expected.safetensors  F32:
    logits            [2, S, V]  initial model, step 0 micro batch 0
    loss              [N]        per step: mean over the micro batches of their mean CE
    grad_norm         [N]        per step: global gradient 2-norm before clipping
    lr                [N]        per step: the learning rate that step used
    grad.<name>                  step-0 gradient of every parameter (before clipping)
    param.<name>                 every parameter after N optimizer steps

Everything is computed in float64 (torch autograd), starting from exactly the fp32 values
written to model.safetensors. Needs only torch (1.13 is enough); no transformers and no
safetensors package: both the model and the file format are written out by hand here.
Deterministic for a given --seed.
"""
import argparse
import json
import math
import os
import struct
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except Exception as e:  # noqa: BLE001 - any import failure is the same failure here
    print(f"llama_reference.py: cannot import torch with {sys.executable}: {e}", file=sys.stderr)
    sys.exit(2)

# ----------------------------------------------------------------------------------------
# Sizes of the run.

V, H, F_, L = 67, 32, 48, 2        # vocab, hidden, MLP intermediate, layers
NH, NKV, D = 4, 2, 8               # query heads, key/value heads (GQA), head dim
S = 16                             # sequence length
NUM_TOKENS = 13 * S + 1            # 13 samples: sampling wraps around within a few steps
MICRO_BATCH = 2                    # rows per micro batch (b)
GRAD_ACCUM = 2                     # micro batches per optimizer step (g)
DP_WORLD, DP_RANK = 1, 0           # one data-parallel rank
EPS = 1e-5                         # rms_norm_eps
ROPE_THETA = 10000.0
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
# transformers 5's yarn (_compute_yarn_parameters): with D = 8 and 16 original positions,
# frequency 0 is kept and 1..3 are divided by the factor; cos and sin are scaled by
# attention_factor = 0.1 ln(factor) + 1.
YARN_SCALING = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                "beta_fast": 32.0, "beta_slow": 1.0}
INIT_STD = 0.1                     # linear / embedding init (HF would use 0.02)
NORM_INIT_STD = 0.1                # norm weights: 1 + 0.1 * normal

DS_CONFIG = {
    "train_micro_batch_size_per_gpu": MICRO_BATCH,
    "gradient_accumulation_steps": GRAD_ACCUM,
    "train_batch_size": MICRO_BATCH * GRAD_ACCUM * DP_WORLD,
    "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW",
                  "params": {"lr": 0.01, "betas": [0.9, 0.95], "eps": 1e-8,
                             "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupLR",
                  "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 0.01,
                             "warmup_num_steps": 3, "warmup_type": "linear"}},
    # File order, which micro_batch reads, unless --sample-order gives the shuffled one.
    "data": {"shuffle": False},
}


def hf_config(tied, rope):
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": V,
        "hidden_size": H,
        "intermediate_size": F_,
        "num_hidden_layers": L,
        "num_attention_heads": NH,
        "num_key_value_heads": NKV,
        "head_dim": D,
        "rms_norm_eps": EPS,
        "rope_theta": ROPE_THETA,
        "rope_scaling": (dict(LLAMA3_SCALING) if rope == "llama3" else
                         dict(YARN_SCALING) if rope == "yarn" else None),
        "tie_word_embeddings": bool(tied),
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "max_position_embeddings": 64,
        "initializer_range": 0.02,
        "torch_dtype": "float32",
    }


# ----------------------------------------------------------------------------------------
# safetensors, by hand: u64 little-endian header length n, n bytes of JSON header
# {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}} padded
# with spaces so n % 8 == 0, then the raw little-endian tensor bytes (offsets are relative
# to the start of that data block, tensors back to back in the order given).

def write_safetensors(path, tensors):
    """tensors: list of (name, torch tensor); every tensor is written as F32."""
    header = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name, t in tensors:
        a = np.ascontiguousarray(t.detach().to(torch.float32).numpy()).astype("<f4")
        b = a.tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    """Reads back an F32 safetensors file: {name: float32 torch tensor}."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    assert n % 8 == 0, f"{path}: header length {n} not a multiple of 8"
    header = json.loads(data[8:8 + n].decode("utf-8"))
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (name, info["dtype"])
        b, e = info["data_offsets"]
        count = int(np.prod(info["shape"], dtype=np.int64))
        assert e - b == 4 * count, (name, info)
        a = np.frombuffer(data, dtype="<f4", count=count, offset=base + b)
        out[name] = torch.from_numpy(a.reshape(info["shape"]).copy())
    assert base + max((i["data_offsets"][1] for k, i in header.items()
                       if k != "__metadata__"), default=0) == len(data), f"{path}: size"
    return out


# ----------------------------------------------------------------------------------------
# Parameters, Hugging Face names and shapes. Weights are [out_features, in_features].

def param_shapes(tied):
    shapes = [("model.embed_tokens.weight", [V, H])]
    for i in range(L):
        p = f"model.layers.{i}."
        shapes += [
            (p + "input_layernorm.weight", [H]),
            (p + "self_attn.q_proj.weight", [NH * D, H]),
            (p + "self_attn.k_proj.weight", [NKV * D, H]),
            (p + "self_attn.v_proj.weight", [NKV * D, H]),
            (p + "self_attn.o_proj.weight", [H, NH * D]),
            (p + "post_attention_layernorm.weight", [H]),
            (p + "mlp.gate_proj.weight", [F_, H]),
            (p + "mlp.up_proj.weight", [F_, H]),
            (p + "mlp.down_proj.weight", [H, F_]),
        ]
    shapes.append(("model.norm.weight", [H]))
    if not tied:
        shapes.append(("lm_head.weight", [V, H]))
    return shapes


def init_params(tied, gen):
    """Seeded fp32 init, drawn in the order of param_shapes: norm weights 1 + 0.1*N(0,1),
    everything else 0.1*N(0,1)."""
    params = []
    for name, shape in param_shapes(tied):
        z = torch.randn(shape, generator=gen, dtype=torch.float64)
        if name.endswith("norm.weight"):
            w = 1.0 + NORM_INIT_STD * z
        else:
            w = INIT_STD * z
        params.append((name, w.to(torch.float32)))
    return params


# ----------------------------------------------------------------------------------------
# The model: Hugging Face LlamaForCausalLM, written out.

def rope_inv_freq(rope):
    """inv_freq[i] = 1 / theta^(2i/D), i < D/2; with llama3 scaling as in transformers'
    _compute_llama3_parameters (attention_factor 1, so cos/sin are not rescaled)."""
    inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    if rope == "default":
        return inv_freq
    if rope == "yarn":
        c = YARN_SCALING
        orig, factor = c["original_max_position_embeddings"], c["factor"]

        def correction_dim(rotations):  # the dimension that turns `rotations` times over orig
            return D * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(ROPE_THETA))
        low = max(math.floor(correction_dim(c["beta_fast"])), 0)
        high = min(math.ceil(correction_dim(c["beta_slow"])), D - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(D // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        extrapolation = 1 - ramp  # the share of the unscaled frequency
        return inv_freq / factor * (1 - extrapolation) + inv_freq * extrapolation
    c = LLAMA3_SCALING
    factor, lo, hi = c["factor"], c["low_freq_factor"], c["high_freq_factor"]
    old_ctx = c["original_max_position_embeddings"]
    low_freq_wavelen = old_ctx / lo
    high_freq_wavelen = old_ctx / hi
    wavelen = 2 * math.pi / inv_freq
    # wavelen < high_freq_wavelen: unchanged; wavelen > low_freq_wavelen: divided by factor;
    # in between: interpolate between inv_freq / factor and inv_freq with smooth_factor.
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)


def rope_cos_sin(rope, positions):
    """cos, sin: [B, 1, S, D] for positions [B, S]; angle(p, j) = p * inv_freq[j mod D/2]."""
    freqs = positions.to(torch.float64)[..., None] * rope_inv_freq(rope)  # [B, S, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)                               # [B, S, D]
    scale = 0.1 * math.log(YARN_SCALING["factor"]) + 1 if rope == "yarn" else 1.0  # yarn's attention_factor
    return scale * emb.cos()[:, None], scale * emb.sin()[:, None]


def rotate_half(x):
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rms_norm(x, w):
    # x * rsqrt(mean(x^2 over the hidden dim) + eps) * w
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def attention(x, P, p, cos, sin, docs):
    """x: [B, S, H] (already normed). Causal softmax attention within documents (docs: [B, S]
    document ids), scale 1/sqrt(D), rotate-half RoPE on q and k, GQA: query head h reads kv
    head h // (NH / NKV)."""
    B = x.shape[0]
    q = F.linear(x, P[p + "self_attn.q_proj.weight"]).view(B, S, NH, D).transpose(1, 2)
    k = F.linear(x, P[p + "self_attn.k_proj.weight"]).view(B, S, NKV, D).transpose(1, 2)
    v = F.linear(x, P[p + "self_attn.v_proj.weight"]).view(B, S, NKV, D).transpose(1, 2)
    q = q * cos + rotate_half(q) * sin                   # [B, NH, S, D]
    k = k * cos + rotate_half(k) * sin                   # [B, NKV, S, D]
    rep = NH // NKV
    k = k.repeat_interleave(rep, dim=1)                  # head h -> kv head h // rep
    v = v.repeat_interleave(rep, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)      # [B, NH, S, S]
    causal = torch.ones(S, S, dtype=torch.bool).triu(1)  # key position > query position
    other_doc = docs[:, None, :, None] != docs[:, None, None, :]  # [B, 1, S, S]
    scores = scores.masked_fill(causal | other_doc, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v              # [B, NH, S, D]
    out = out.transpose(1, 2).reshape(B, S, NH * D)
    return F.linear(out, P[p + "self_attn.o_proj.weight"])


def mlp(x, P, p):
    # down(silu(gate(x)) * up(x))
    g = F.linear(x, P[p + "mlp.gate_proj.weight"])
    u = F.linear(x, P[p + "mlp.up_proj.weight"])
    return F.linear(F.silu(g) * u, P[p + "mlp.down_proj.weight"])


def forward(P, inputs, tied, rope, positions, docs):
    """P: {hf name: float64 tensor}; inputs, positions, docs: [B, S] int64. Returns logits
    [B, S, V]."""
    cos, sin = rope_cos_sin(rope, positions)
    x = P["model.embed_tokens.weight"][inputs]
    for i in range(L):
        p = f"model.layers.{i}."
        x = x + attention(rms_norm(x, P[p + "input_layernorm.weight"]), P, p, cos, sin, docs)
        x = x + mlp(rms_norm(x, P[p + "post_attention_layernorm.weight"]), P, p)
    x = rms_norm(x, P["model.norm.weight"])
    head = P["model.embed_tokens.weight"] if tied else P["lm_head.weight"]
    return F.linear(x, head)


# ----------------------------------------------------------------------------------------
# Data: sample k is tokens[k*S : k*S + S + 1], k taken modulo the number of whole samples.
# Row j of micro batch m of optimizer step t on data-parallel rank r reads global sample
#   gs = ((t * g + m) * dp_world + r) * b + j,
# which is file sample k = gs in file order, or SAMPLE_ORDER[gs] (--sample-order) shuffled.

#
# Packed (eos given): token eos ends its document. Position ids count from the document's
# start in the stream; document ids count the documents of the sample from 0; a token that
# ends a document (== eos) has label -100 (ignored).

SAMPLE_ORDER = None  # --sample-order: the file sample of each global sample


def micro_batch(tokens, t, m, eos):
    num_samples = (len(tokens) - 1) // S
    rows_in, rows_lab, rows_pos, rows_doc = [], [], [], []
    for j in range(MICRO_BATCH):
        gs = ((t * GRAD_ACCUM + m) * DP_WORLD + DP_RANK) * MICRO_BATCH + j
        if SAMPLE_ORDER is None:
            k = gs % num_samples
        else:
            assert gs < len(SAMPLE_ORDER), f"--sample-order has {len(SAMPLE_ORDER)} samples, step {t} needs {gs + 1}"
            k = SAMPLE_ORDER[gs]
            assert 0 <= k < num_samples, f"--sample-order: {k} is not one of the {num_samples} samples"
        inputs = tokens[k * S: k * S + S]
        labels = tokens[k * S + 1: k * S + S + 1].clone()
        if eos is None:
            pos, doc = torch.arange(S), torch.zeros(S, dtype=torch.int64)
        else:
            start = k * S  # back to the start of the first token's document
            while start > 0 and tokens[start - 1] != eos:
                start -= 1
            pos, doc = [], []
            p, d = k * S - start, 0
            for i in range(S):
                pos.append(p)
                doc.append(d)
                p += 1
                if inputs[i] == eos:  # the document ends here: no label, next one starts
                    labels[i] = -100
                    p, d = 0, d + 1
            pos, doc = torch.tensor(pos), torch.tensor(doc)
        rows_in.append(inputs)
        rows_lab.append(labels)
        rows_pos.append(pos)
        rows_doc.append(doc)
    return torch.stack(rows_in), torch.stack(rows_lab), torch.stack(rows_pos), torch.stack(rows_doc)


# ----------------------------------------------------------------------------------------
# Learning rate: DeepSpeed WarmupLR, as src/train/lr_schedule.h documents lr_at(step).
# DeepSpeed's constructor writes warmup_min_lr into the optimizer (last_batch_iteration
# = -1) and the engine calls scheduler.step() after every optimizer step, so optimizer step
# k runs with get_lr() at last_batch_iteration i = k - 1:
#   k = 0:        warmup_min_lr
#   i < n:        min + (max - min) * gamma, gamma = i / n (linear) or log(i+1) / log(n)
#   otherwise:    max
# with n = max(2, warmup_num_steps). With min 0, max 0.01, n 3, linear that is
#   0, 0, 0.00333.., 0.00666.., 0.01, 0.01, ...

def lr_at(step):
    sp = DS_CONFIG["scheduler"]["params"]
    lo, hi = sp["warmup_min_lr"], sp["warmup_max_lr"]
    n = max(2, sp["warmup_num_steps"])
    i = step - 1
    if i < 0:
        return lo
    if i >= n:
        return hi
    if sp["warmup_type"] == "linear":
        gamma = i / n
    else:
        gamma = math.log(i + 1) / math.log(n)
    return lo + (hi - lo) * gamma


# ----------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--tied", type=int, choices=[0, 1], default=0)
    ap.add_argument("--rope", choices=["llama3", "default", "yarn"], default="llama3")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--seq-len", type=int, default=16)
    ap.add_argument("--accum", type=int, default=2)
    ap.add_argument("--eos", type=int, default=None, help="pack documents ended by this token id")
    ap.add_argument("--sample-order", default=None,
                    help="comma-separated file sample of each global sample (the shuffled order)")
    ap.add_argument("--data-seed", type=int, default=None, help="data.seed that gave --sample-order")
    args = ap.parse_args()
    assert (args.sample_order is None) == (args.data_seed is None), "--sample-order goes with --data-seed"
    global SAMPLE_ORDER
    if args.sample_order is not None:
        SAMPLE_ORDER = [int(k) for k in args.sample_order.split(",")]
        DS_CONFIG["data"] = {"shuffle": True, "seed": args.data_seed}
    assert args.eos is None or 0 <= args.eos < V
    assert args.steps >= 1 and args.seq_len >= 1 and args.accum >= 1
    global S, NUM_TOKENS, GRAD_ACCUM
    S, GRAD_ACCUM = args.seq_len, args.accum
    NUM_TOKENS = 13 * S + 1
    DS_CONFIG["gradient_accumulation_steps"] = GRAD_ACCUM
    DS_CONFIG["train_batch_size"] = MICRO_BATCH * GRAD_ACCUM * DP_WORLD
    tied = bool(args.tied)

    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    out = lambda name: os.path.join(args.out, name)  # noqa: E731

    # The files a user brings.
    gen = torch.Generator().manual_seed(args.seed)
    init = init_params(tied, gen)                                  # fp32
    tokens32 = torch.randint(0, V, (NUM_TOKENS,), generator=gen, dtype=torch.int64)
    if args.eos is not None:
        DS_CONFIG["data"]["eos_token_id"] = args.eos
        tokens32[tokens32 == args.eos] = (args.eos + 1) % V
        # Sample 0's documents start at 4, 8 and 12: on every rank chunk boundary of S = 15
        # at SP 2 (chunks of 8) and SP 4 (chunks of 4); then documents of 1 to 2S tokens,
        # inside chunks, across chunks and samples, the last one running to the end.
        for at in (3, 7, 11):
            tokens32[at] = args.eos
        at = 12
        while True:
            at += int(torch.randint(1, 2 * S + 1, (1,), generator=gen))
            if at > NUM_TOKENS:
                break
            tokens32[at - 1] = args.eos
    with open(out("config.json"), "w") as f:
        json.dump(hf_config(tied, args.rope), f, indent=2)
        f.write("\n")
    with open(out("ds_config.json"), "w") as f:
        json.dump(DS_CONFIG, f, indent=2)
        f.write("\n")
    write_safetensors(out("model.safetensors"), init)
    tokens32.numpy().astype("<u4").tofile(out("tokens.bin"))

    # Float64 training from exactly those fp32 values.
    names = [n for n, _ in init]
    P = {n: w.to(torch.float64).clone().requires_grad_(True) for n, w in init}
    params = [P[n] for n in names]
    opt_cfg = DS_CONFIG["optimizer"]["params"]
    opt = torch.optim.AdamW(params, lr=opt_cfg["lr"], betas=tuple(opt_cfg["betas"]),
                            eps=opt_cfg["eps"], weight_decay=opt_cfg["weight_decay"])
    tokens = tokens32.clone()

    losses, norms, lrs = [], [], []
    logits0, grads0 = None, None
    for t in range(args.steps):
        # Gradient accumulation as DeepSpeed: each micro batch's mean cross-entropy is
        # scaled by 1/g before backward and the gradients are summed, so the step gradient
        # is the gradient of the step loss = mean of the micro losses.
        step_loss = 0.0
        for m in range(GRAD_ACCUM):
            inputs, labels, positions, docs = micro_batch(tokens, t, m, args.eos)
            logits = forward(P, inputs, tied, args.rope, positions, docs)
            if t == 0 and m == 0:
                logits0 = logits.detach().clone()
            loss = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=-100)
            (loss / GRAD_ACCUM).backward()
            step_loss += loss.item() / GRAD_ACCUM
        if t == 0:
            grads0 = {n: P[n].grad.detach().clone() for n in names}
        # Global 2-norm over all gradients, then scale by min(1, 1 / (norm + 1e-6)).
        norm = torch.nn.utils.clip_grad_norm_(params, DS_CONFIG["gradient_clipping"])
        lr = lr_at(t)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(step_loss)
        norms.append(norm.item())
        lrs.append(lr)
        print(f"step {t}: loss {step_loss:.6f}  grad_norm {norm.item():.6f}  lr {lr:.6g}")

    expected = [("logits", logits0),
                ("loss", torch.tensor(losses)),
                ("grad_norm", torch.tensor(norms)),
                ("lr", torch.tensor(lrs))]
    expected += [("grad." + n, grads0[n]) for n in names]
    expected += [("param." + n, P[n].detach()) for n in names]
    write_safetensors(out("expected.safetensors"), expected)

    # Self-check: both files read back to what was meant to be written.
    back = read_safetensors(out("model.safetensors"))
    assert list(back) == names and all(torch.equal(back[n], w) for n, w in init)
    back = read_safetensors(out("expected.safetensors"))
    assert list(back) == [n for n, _ in expected]
    assert all(torch.equal(back[n], v.to(torch.float32)) for n, v in expected)
    assert np.array_equal(np.fromfile(out("tokens.bin"), dtype="<u4"), tokens32.numpy())
    print(f"wrote {args.out}: tied={int(tied)} rope={args.rope} steps={args.steps} "
          f"seed={args.seed}, {len(names)} parameters, loss {losses[0]:.4f} -> {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
