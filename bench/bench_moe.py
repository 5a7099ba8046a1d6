#!/usr/bin/env python3
"""Mixture-of-experts training step: autosp against PyTorch 2, in the same run, as ratios.

Usage (from the repository root, under the venv of scripts/install_bench_venv.sh):
  ~/.cache/autosp/bench-venv/bin/python bench/bench_moe.py [--autosp build/autosp]
      [--family mixtral|deepseek_v3|gpt_oss|llama4] [--threads 2] [--sizes 512,1024,2048] [--steps 4]
      [--checkpoint none] [--out FILE.json] [--quick] [--keep]

The model (--family, FAMILIES): transformers' MixtralForCausalLM (vocab 4096, hidden 512, 4
layers, 8 heads, 2 kv heads, 8 SwiGLU experts of 1024, top-2; router jitter and attention
dropout 0, no router aux loss), or DeepseekV3ForCausalLM of the same vocabulary, hidden size,
layers and heads (multi-head latent attention: q and kv ranks 256 and 128, keys of 64 + a
rotary 32, values 64; 16 routed experts of 256 in 4 groups, 2 kept, top 4, the sigmoid router
with its correction bias, a shared expert, a dense first layer of 1024), or GptOssForCausalLM
of the same sizes (attention sinks, sliding layers of 128 between full ones, 2 kv heads of 64,
YaRN; 8 clamped-GLU experts of 1024 with biases, top 2; torch runs its eager attention, since
transformers gives gpt-oss no SDPA), or Llama4ForCausalLM (Scout's layout: every layer MoE, 8
experts of 1024, top 1, weighting the expert's input, a shared expert; chunked attention in
chunks of 512, lowered from 8192 so that they act; a NoPE layer in 4 with its temperature
tuning; the q and k norm), built with
torch.manual_seed(0), float32, saved with save_pretrained and exported with
python/autosp/export.py (each sparse MoE block becomes one `autosp::moe` node, which autosp
runs sparsely: each expert on its own tokens). Both sides start from these weights.

Data: one flat little-endian uint32 file of seeded random ids in [0, 4096); sample k is tokens
[k*S, k*S+S+1), inputs its first S, labels its last S; step i trains on sample i-1 on both
sides (autosp with "data": {"shuffle": false}). Micro batch 1, AdamW (lr 1e-4, betas 0.9/0.95,
eps 1e-8, weight decay 0.1), gradient clipping 1.0: bench_train.py's ds_config, read by both.

autosp: `autosp train --model model.pt2 ... --metrics M.jsonl`, compile.checkpoint from
--checkpoint (default none; "default" leaves the key out). torch: this script with --torch-child:
AutoModelForCausalLM.from_pretrained(dir, attn_implementation="sdpa"), train mode, its own
torch.optim.AdamW and clip_grad_norm_. Its loss is F.cross_entropy of all S logits against the
S next tokens, not transformers' labels= (which shifts inside, scoring S - 1 positions), so
both sides score the same S positions; torch makes the [S, V] logits, autosp's fused head not.

Step time: per side, the median of the steps after the first (which pays one-time costs).
Peak RSS: ru_maxrss (os.wait4) of each side's process, fixed costs included (torch's imports;
autosp's import and compile); the model is built in a child too, so this process stays small
(a child's ru_maxrss starts from the RSS of the process it was forked from). Both sides get
OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = --threads; OPENBLAS_CORETYPE and the rest of the
environment pass through. Step-1 losses (same weights and data) should be near ln V = 8.32 and
agree to ~1e-3; a difference, a bad loss, a failed run, or other processes' CPU use during a
run ("others_cores") is noted, never raised. Times are not asserted: the ratios are the result.
"""
import argparse
import copy
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_train import ds_config, run_measured, thread_env  # noqa: E402

GIB = 1024 ** 3
VENV_PYTHON = os.path.expanduser("~/.cache/autosp/bench-venv/bin/python")
COMMON = dict(vocab_size=4096, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
              num_attention_heads=8, max_position_embeddings=65536, attention_dropout=0.0,
              tie_word_embeddings=False, torch_dtype="float32")
# --family: (the model class and its config class in transformers, the config)
FAMILIES = {
    "mixtral": ("MixtralForCausalLM", "MixtralConfig", dict(
        COMMON, num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2, router_jitter_noise=0.0,
        output_router_logits=False)),
    "deepseek_v3": ("DeepseekV3ForCausalLM", "DeepseekV3Config", dict(
        COMMON, num_key_value_heads=8, q_lora_rank=256, kv_lora_rank=128, qk_nope_head_dim=64,
        qk_rope_head_dim=32, v_head_dim=64, n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2,
        moe_intermediate_size=256, n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.5,
        rope_interleave=True)),
    "gpt_oss": ("GptOssForCausalLM", "GptOssConfig", dict(
        COMMON, num_key_value_heads=2, head_dim=64, num_local_experts=8, num_experts_per_tok=2, sliding_window=128,
        layer_types=["sliding_attention", "full_attention"] * 2, router_aux_loss_coef=0.0,
        output_router_logits=False)),
    # Llama 4 Scout's layout at these sizes (every layer MoE, 8 experts of 1024, top 1, a shared
    # expert, a NoPE layer in 4 with the temperature tuning), its chunk lowered from 8192 to 512
    # so that the chunks act at these lengths.
    "llama4": ("Llama4ForCausalLM", "Llama4TextConfig", dict(
        COMMON, num_key_value_heads=2, head_dim=64, intermediate_size_mlp=2048, num_local_experts=8,
        num_experts_per_tok=1, interleave_moe_layer_step=1, attention_chunk_size=512, use_qk_norm=True,
        output_router_logits=False)),
}
# transformers' attention for the torch side: SDPA, but gpt-oss's sinks have none in transformers
# (GptOssForCausalLM._supports_sdpa is False): its eager attention, the one a CPU user runs.
TORCH_ATTENTION = {"gpt_oss": "eager"}
MODEL = FAMILIES["mixtral"][2]  # (the vocabulary and the defaults the checks read are alike in all)
LOSS_TOL = 1e-3  # step-1 losses, same weights and data: fp32 summation order and MoE routing


def prepare(work, n_tokens, family):
    """The model directory (save_pretrained), its .pt2 and the token file, in work."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import torch
    import transformers
    from autosp.export import export
    torch.manual_seed(0)
    model_class, config_class, config = FAMILIES[family]
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config)).float()
    model_dir, pt2 = os.path.join(work, family), os.path.join(work, family + ".pt2")
    model.save_pretrained(model_dir)
    export(copy.deepcopy(model), pt2)  # export switches the attention and the MoE forward
    tokens = os.path.join(work, "tokens.bin")
    ids = np.random.RandomState(0).randint(0, MODEL["vocab_size"], size=n_tokens)
    ids.astype("<u4").tofile(tokens)
    print(json.dumps({"model_dir": model_dir, "pt2": pt2, "tokens": tokens,
                      "parameters": sum(p.numel() for p in model.parameters()),
                      "torch": torch.__version__, "transformers": transformers.__version__}))


def torch_child(a):
    """One PyTorch run: prints one JSON line per step (time, loss)."""
    import time
    import torch
    import torch.nn.functional as F
    import transformers
    torch.set_num_threads(a.threads)
    with open(a.config) as f:
        ds = json.load(f)
    op = ds["optimizer"]["params"]
    model = transformers.AutoModelForCausalLM.from_pretrained(
        a.model_dir, attn_implementation=TORCH_ATTENTION.get(a.family, "sdpa"), dtype=torch.float32)
    model.config.use_cache = False
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=op["lr"], betas=tuple(op["betas"]),
                            eps=op["eps"], weight_decay=op["weight_decay"])
    S, tokens = a.seq_len, np.fromfile(a.data, dtype="<u4")
    for step in range(a.steps):
        chunk = torch.from_numpy(tokens[step * S:step * S + S + 1].astype(np.int64))
        ids, labels = chunk[:-1][None], chunk[1:]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=ids, use_cache=False).logits
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), ds["gradient_clipping"])
        opt.step()
        value = loss.item()
        del logits, loss
        print(json.dumps({"step": step + 1, "step_time_s": time.perf_counter() - t0,
                          "loss": value}), flush=True)


def summarize(r, rows, steps):
    if rows:
        times = [row["step_time_s"] for row in rows]
        r["step_time_s"] = times
        r["median_step_time_s"] = statistics.median(times[1:] or times)
        r["loss"] = [row["loss"] for row in rows]
        r["loss_step1"] = rows[0]["loss"]
    if r["status"] == "ok" and len(rows) != steps:
        r["status"] = "error"
        r["log_tail"] = f"{len(rows)} step rows for {steps} steps"
    return r


def measured(cmd, a, base):
    """run_measured, plus "others_cores": the CPU other processes used meanwhile, in cores
    (the machine's busy CPU time from /proc/stat minus the child's, over the wall time): above
    ~0.2 another program took cores from the run and its times are not clean."""
    def busy_s():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait
    before = busy_s()
    r, text = run_measured(cmd, thread_env(a.threads), base + ".log", a.timeout_s)
    r["others_cores"] = round((busy_s() - before - r["cpu_s"]) / r["wall_s"], 2)
    return r, text


def run_autosp(a, work, cfg, pt2, tokens, S):
    base = os.path.join(work, f"autosp_S{S}")
    cmd = [a.autosp, "train", "--config", cfg, "--model", pt2, "--data", tokens,
           "--seq-len", str(S), "--steps", str(a.steps), "--metrics", base + ".jsonl"]
    r, text = measured(cmd, a, base)
    m = base + ".jsonl"
    rows = [json.loads(ln) for ln in open(m) if ln.strip()] if os.path.exists(m) else []
    r["warnings"] = sorted({ln.strip().replace(work + "/", "") for ln in text.splitlines()
                           if ln.startswith("autosp: warning:")})
    return summarize(dict(r, side="autosp", S=S), rows, a.steps)


def run_torch(a, work, cfg, model_dir, tokens, S):
    base = os.path.join(work, f"torch_S{S}")
    cmd = [a.python, os.path.abspath(__file__), "--torch-child", "--model-dir", model_dir,
           "--config", cfg, "--data", tokens, "--seq-len", str(S), "--steps", str(a.steps),
           "--threads", str(a.threads), "--family", a.family]
    r, text = measured(cmd, a, base)
    rows = [json.loads(ln) for ln in text.splitlines() if ln.startswith('{"step"')]
    return summarize(dict(r, side="torch2", S=S), rows, a.steps)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--autosp", default=os.path.join(ROOT, "build", "autosp"))
    ap.add_argument("--family", default="mixtral", choices=sorted(FAMILIES))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sizes", default=None, help="comma list (default 512,1024,2048)")
    ap.add_argument("--steps", type=int, default=None, help="default 4 (quick 3)")
    ap.add_argument("--checkpoint", default="none", help="compile.checkpoint, or 'default'")
    ap.add_argument("--out", default=None, help="write the results here (JSON)")
    ap.add_argument("--quick", action="store_true", help="sizes 512,1024 and 3 steps")
    ap.add_argument("--timeout-s", type=float, default=1200, help="per run")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--torch-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--prepare-child", type=int, help=argparse.SUPPRESS)  # its token count
    for k in ("--model-dir", "--config", "--data"):
        ap.add_argument(k, help=argparse.SUPPRESS)
    ap.add_argument("--seq-len", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.steps = a.steps or (3 if a.quick else 4)
    if a.torch_child:
        return torch_child(a)
    if a.prepare_child:
        return prepare(a.data, a.prepare_child, a.family)
    a.python = sys.executable
    sizes = [int(x) for x in (a.sizes or ("512,1024" if a.quick else "512,1024,2048")).split(",")]

    work = tempfile.mkdtemp(prefix="bench_moe_")
    try:
        # In a child, so that this process stays small: Linux keeps the high-water RSS of
        # the process a child was forked from in the child's ru_maxrss across exec.
        p = subprocess.run([a.python, os.path.abspath(__file__), "--data", work,
                            "--prepare-child", str(a.steps * max(sizes) + 1), "--family", a.family],
                           env=thread_env(a.threads), capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"bench_moe.py: building and exporting the model failed (needs torch 2.x and "
                     f"transformers: run under {VENV_PYTHON}):\n{p.stderr[-3000:]}")
        prep = json.loads(p.stdout.strip().splitlines()[-1])
        model_dir, pt2, tokens = prep["model_dir"], prep["pt2"], prep["tokens"]
        cfg = os.path.join(work, "ds_config.json")
        ds = ds_config(1, None if a.checkpoint == "default" else a.checkpoint)
        ds["data"] = {"shuffle": False}
        with open(cfg, "w") as f:
            json.dump(ds, f, indent=1)
        results, notes = [], []
        for S in sizes:
            for side in (run_autosp(a, work, cfg, pt2, tokens, S),
                         run_torch(a, work, cfg, model_dir, tokens, S)):
                results.append(side)
                notes += run_notes(S, side, MODEL["vocab_size"])
        print_table(a, sizes, results, prep, notes)
        if a.out:
            with open(a.out, "w") as f:
                json.dump({"family": a.family, "model": FAMILIES[a.family][2], "parameters": prep["parameters"], "threads": a.threads,
                           "steps": a.steps, "checkpoint": a.checkpoint, "torch": prep["torch"],
                           "transformers": prep["transformers"], "results": results,
                           "notes": notes}, f, indent=1)
            print(f"wrote {a.out}")
    finally:
        if a.keep:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def run_notes(S, run, vocab_size):
    """What is worth saying of one run: a failure, a first loss far from ln V, other processes'
    CPU use during it, autosp's warnings."""
    notes = []
    if run["status"] != "ok":
        notes.append(f"S={S} {run['side']}: {run['status']} (rc {run['rc']}):\n{run.get('log_tail', '').rstrip()}")
    l1 = run.get("loss_step1")
    if l1 is not None and not abs(l1 - math.log(vocab_size)) < 0.5:
        notes.append(f"S={S} {run['side']}: step-1 loss {l1} not near ln V")
    if run["others_cores"] > 0.2:
        notes.append(f"S={S} {run['side']}: other processes used {run['others_cores']} cores during the run "
                     "(times noisy)")
    notes += [f"S={S} {run['side']}: {w}" for w in run.get("warnings", [])]
    return notes


def fmt(x, spec=".3f"):
    return "—" if x is None else format(x, spec)


def ratio(num, den):
    return num / den if num and den else None


def print_table(a, sizes, results, prep, notes):
    print(f"\n### {FAMILIES[a.family][0]} training step, {prep['parameters'] / 1e6:.1f} M parameters, "
          f"{a.threads} threads, {a.steps} steps (median of steps 2..), checkpoint "
          f"{a.checkpoint}, torch {prep['torch']} ({TORCH_ATTENTION.get(a.family, 'sdpa')})\n")
    print("| S | autosp step s | torch step s | torch/autosp | autosp RSS GiB | torch RSS GiB "
          "| torch/autosp RSS | autosp loss1 | torch loss1 | loss1 diff |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for S in sizes:
        au, to = (next(r for r in results if r["S"] == S and r["side"] == s)
                  for s in ("autosp", "torch2"))
        ta, tt = au.get("median_step_time_s"), to.get("median_step_time_s")
        ra, rt = (r["peak_rss_bytes"] / GIB if r["status"] == "ok" else None for r in (au, to))
        la, lt = au.get("loss_step1"), to.get("loss_step1")
        diff = abs(la - lt) if la is not None and lt is not None else None
        if diff is not None and not diff <= LOSS_TOL:
            notes.append(f"S={S}: step-1 losses differ by {diff:.2e} (> {LOSS_TOL:g})")
        print(f"| {S} | {fmt(ta)} | {fmt(tt)} | {fmt(ratio(tt, ta), '.2f')} | {fmt(ra, '.2f')} "
              f"| {fmt(rt, '.2f')} | {fmt(ratio(rt, ra), '.2f')} | {fmt(la, '.5f')} "
              f"| {fmt(lt, '.5f')} | {fmt(diff, '.1e')} |")
    print("\ntorch/autosp > 1: autosp faster (or smaller). Peak RSS includes each side's fixed "
          "costs (imports, compile).")
    for n in notes:
        print("note:", n)


if __name__ == "__main__":
    main()
