#!/usr/bin/env python3
"""LoRA fine-tuning step: autosp against PyTorch 2 + PEFT, in the same run, as ratios.

Usage (from the repository root, under the venv of scripts/install_bench_venv.sh):
  ~/.cache/autosp/bench-venv/bin/python bench/bench_lora.py [--autosp build/autosp]
      [--threads 2] [--sizes 512,1024,2048] [--steps 4] [--checkpoint none] [--out FILE.json]
      [--quick] [--keep]

The model: transformers' LlamaForCausalLM (vocab 4096, hidden 512, intermediate 1024, 4 layers,
8 heads, 2 kv heads, untied head), built with torch.manual_seed(0), float32, and wrapped by PEFT:
get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=q, k, v,
o, gate, up and down_proj)), which freezes the base weights and adds the adapters (lora_A drawn at
random, lora_B zero: PEFT's own initialisation, so the first step's loss is the base model's and
lora_A's first gradient is zero). Three runs per sequence length S:

  autosp LoRA: the PEFT model exported as it is with python/autosp/export.py (its frozen base
    weights become constants of the graph, the adapters alone are trained).
  torch LoRA: this script with --torch-child: LlamaForCausalLM(config) with SDPA attention,
    wrapped by the same LoraConfig, load_state_dict (strict) of the PEFT model's saved state,
    train mode, torch.optim.AdamW and clip_grad_norm_ over the parameters that require grad.
    Its loss is F.cross_entropy of all S logits against the S next tokens, not transformers'
    labels= (which shifts inside, scoring S - 1 positions), so both sides score the same S
    positions; torch makes the [S, V] logits, autosp's fused head not.
  autosp full: the plain LlamaForCausalLM of the same base weights, exported and every weight
    trained: the cost LoRA saves, on autosp's side.

Data: one flat little-endian uint32 file of seeded random ids in [0, 4096); sample k is tokens
[k*S, k*S+S+1), inputs its first S, labels its last S; step i trains on sample i-1 in every run
(autosp with "data": {"shuffle": false}). Micro batch 1, AdamW (lr 1e-4, betas 0.9/0.95, eps
1e-8, weight decay 0.1), gradient clipping 1.0: bench_train.py's ds_config, read by all three.
autosp: `autosp train --model model.pt2 ... --metrics M.jsonl`, compile.checkpoint from
--checkpoint (default none; "default" leaves the key out).

Step time: per run, the median of the steps after the first (which pays one-time costs).
Peak RSS: ru_maxrss (os.wait4) of each run's process, fixed costs included (torch's and PEFT's
imports; autosp's import and compile); the models are built in a child too, so this process
stays small (a child's ru_maxrss starts from the RSS of the process it was forked from). Every
run gets OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = --threads; OPENBLAS_CORETYPE and the rest of
the environment pass through. The ratios are autosp LoRA / torch LoRA and autosp LoRA / autosp
full, of step time and of peak RSS. Step-1 losses of the two LoRA runs (same weights and data)
should be near ln V = 8.32 and agree to ~1e-3; a difference, a bad loss, a failed run, or other
processes' CPU use during a run ("others_cores") is noted, never raised. Times are not asserted:
the ratios are the result.
"""
import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_train import ds_config, thread_env  # noqa: E402
from bench_moe import fmt, measured, ratio, run_notes, summarize  # noqa: E402

GIB = 1024 ** 3
VENV_PYTHON = os.path.expanduser("~/.cache/autosp/bench-venv/bin/python")
MODEL = dict(vocab_size=4096, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=65536,
             attention_dropout=0.0, tie_word_embeddings=False, torch_dtype="float32")
LORA = dict(r=16, lora_alpha=32, lora_dropout=0.0,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
RUNS = ("autosp_lora", "torch_lora", "autosp_full")
LOSS_TOL = 1e-3  # step-1 losses, same weights and data: fp32 summation order


def prepare(work, n_tokens):
    """In work: the base config (config/), the PEFT model's state (lora_state.pt), the two
    programs (lora.pt2, full.pt2) and the token file."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import peft
    import torch
    import transformers
    from autosp.export import export
    torch.manual_seed(0)
    base = transformers.LlamaForCausalLM(transformers.LlamaConfig(**MODEL)).float()
    full = copy.deepcopy(base)  # before get_peft_model, which puts the adapters into base itself
    model = peft.get_peft_model(base, peft.LoraConfig(**LORA))
    config_dir, state = os.path.join(work, "config"), os.path.join(work, "lora_state.pt")
    base.config.save_pretrained(config_dir)
    torch.save(model.state_dict(), state)
    lora_pt2, full_pt2 = os.path.join(work, "lora.pt2"), os.path.join(work, "full.pt2")
    # export switches the attention: the copies keep model and full as they were for the counts.
    # Its default sample batch (2), not 1: torch.export fixes a dimension of size 1 to a constant.
    export(copy.deepcopy(model), lora_pt2)
    export(copy.deepcopy(full), full_pt2)
    tokens = os.path.join(work, "tokens.bin")
    ids = np.random.RandomState(0).randint(0, MODEL["vocab_size"], size=n_tokens)
    ids.astype("<u4").tofile(tokens)
    print(json.dumps({"config_dir": config_dir, "state": state, "lora_pt2": lora_pt2, "full_pt2": full_pt2,
                      "tokens": tokens, "parameters": sum(p.numel() for p in full.parameters()),
                      "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
                      "torch": torch.__version__, "transformers": transformers.__version__,
                      "peft": peft.__version__}))


def torch_child(a):
    """One PyTorch + PEFT run: prints one JSON line per step (time, loss)."""
    import time
    import peft
    import torch
    import torch.nn.functional as F
    import transformers
    torch.set_num_threads(a.threads)
    with open(a.config) as f:
        ds = json.load(f)
    op = ds["optimizer"]["params"]
    config = transformers.LlamaConfig.from_pretrained(a.model_dir, attn_implementation="sdpa")
    model = peft.get_peft_model(transformers.LlamaForCausalLM(config), peft.LoraConfig(**LORA))
    model.load_state_dict(torch.load(a.state, weights_only=True), strict=True)
    model.config.use_cache = False
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=op["lr"], betas=tuple(op["betas"]),
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
        torch.nn.utils.clip_grad_norm_(trainable, ds["gradient_clipping"])
        opt.step()
        value = loss.item()
        del logits, loss
        print(json.dumps({"step": step + 1, "step_time_s": time.perf_counter() - t0,
                          "loss": value}), flush=True)


def run_autosp(a, work, cfg, pt2, tokens, S, run):
    base = os.path.join(work, f"{run}_S{S}")
    cmd = [a.autosp, "train", "--config", cfg, "--model", pt2, "--data", tokens,
           "--seq-len", str(S), "--steps", str(a.steps), "--metrics", base + ".jsonl"]
    r, text = measured(cmd, a, base)
    m = base + ".jsonl"
    rows = [json.loads(ln) for ln in open(m) if ln.strip()] if os.path.exists(m) else []
    r["warnings"] = sorted({ln.strip().replace(work + "/", "") for ln in text.splitlines()
                           if ln.startswith("autosp: warning:")})
    return summarize(dict(r, side=run, S=S), rows, a.steps)


def run_torch(a, work, cfg, prep, S):
    base = os.path.join(work, f"torch_lora_S{S}")
    cmd = [a.python, os.path.abspath(__file__), "--torch-child", "--model-dir", prep["config_dir"],
           "--state", prep["state"], "--config", cfg, "--data", prep["tokens"], "--seq-len", str(S),
           "--steps", str(a.steps), "--threads", str(a.threads)]
    r, text = measured(cmd, a, base)
    rows = [json.loads(ln) for ln in text.splitlines() if ln.startswith('{"step"')]
    return summarize(dict(r, side="torch_lora", S=S), rows, a.steps)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--autosp", default=os.path.join(ROOT, "build", "autosp"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sizes", default=None, help="comma list (default 512,1024,2048)")
    ap.add_argument("--steps", type=int, default=None, help="default 4 (quick 3)")
    ap.add_argument("--checkpoint", default="none", help="compile.checkpoint, or 'default'")
    ap.add_argument("--out", default=None, help="write the results here (JSON)")
    ap.add_argument("--quick", action="store_true", help="size 512 and 3 steps")
    ap.add_argument("--timeout-s", type=float, default=1200, help="per run")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--torch-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--prepare-child", type=int, help=argparse.SUPPRESS)  # its token count
    for k in ("--model-dir", "--state", "--config", "--data"):
        ap.add_argument(k, help=argparse.SUPPRESS)
    ap.add_argument("--seq-len", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.steps = a.steps or (3 if a.quick else 4)
    if a.torch_child:
        return torch_child(a)
    if a.prepare_child:
        return prepare(a.data, a.prepare_child)
    a.python = sys.executable
    sizes = [int(x) for x in (a.sizes or ("512" if a.quick else "512,1024,2048")).split(",")]

    work = tempfile.mkdtemp(prefix="bench_lora_")
    try:
        # In a child, so that this process stays small: Linux keeps the high-water RSS of
        # the process a child was forked from in the child's ru_maxrss across exec.
        p = subprocess.run([a.python, os.path.abspath(__file__), "--data", work,
                            "--prepare-child", str(a.steps * max(sizes) + 1)],
                           env=thread_env(a.threads), capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"bench_lora.py: building and exporting the model failed (needs torch 2.x, "
                     f"transformers and peft: run under {VENV_PYTHON}):\n{p.stderr[-3000:]}")
        prep = json.loads(p.stdout.strip().splitlines()[-1])
        cfg = os.path.join(work, "ds_config.json")
        ds = ds_config(1, None if a.checkpoint == "default" else a.checkpoint)
        ds["data"] = {"shuffle": False}
        with open(cfg, "w") as f:
            json.dump(ds, f, indent=1)
        results, notes = [], []
        for S in sizes:
            for run in (run_autosp(a, work, cfg, prep["lora_pt2"], prep["tokens"], S, "autosp_lora"),
                        run_torch(a, work, cfg, prep, S),
                        run_autosp(a, work, cfg, prep["full_pt2"], prep["tokens"], S, "autosp_full")):
                results.append(run)
                notes += run_notes(S, run, MODEL["vocab_size"])
        print_table(a, sizes, results, prep, notes)
        if a.out:
            with open(a.out, "w") as f:
                json.dump({"model": MODEL, "lora": LORA, "parameters": prep["parameters"],
                           "trainable": prep["trainable"], "threads": a.threads, "steps": a.steps,
                           "checkpoint": a.checkpoint, "torch": prep["torch"],
                           "transformers": prep["transformers"], "peft": prep["peft"],
                           "results": results, "notes": notes}, f, indent=1)
            print(f"wrote {a.out}")
    finally:
        if a.keep:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def print_table(a, sizes, results, prep, notes):
    print(f"\n### LlamaForCausalLM LoRA step (r {LORA['r']}, all 7 projections), "
          f"{prep['parameters'] / 1e6:.1f} M parameters, {prep['trainable'] / 1e6:.2f} M trained, "
          f"{a.threads} threads, {a.steps} steps (median of steps 2..), checkpoint {a.checkpoint}, "
          f"torch {prep['torch']} + peft {prep['peft']} (sdpa)\n")
    print("| S | autosp LoRA s | torch LoRA s | autosp full s | LoRA/torch | LoRA/full "
          "| autosp LoRA RSS GiB | torch LoRA RSS GiB | autosp full RSS GiB | LoRA/torch RSS "
          "| LoRA/full RSS | autosp loss1 | torch loss1 | loss1 diff |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for S in sizes:
        lo, to, fu = (next(r for r in results if r["S"] == S and r["side"] == s) for s in RUNS)
        tl, tt, tf = (r.get("median_step_time_s") for r in (lo, to, fu))
        rl, rt, rf = (r["peak_rss_bytes"] / GIB if r["status"] == "ok" else None for r in (lo, to, fu))
        la, lt = lo.get("loss_step1"), to.get("loss_step1")
        diff = abs(la - lt) if la is not None and lt is not None else None
        if diff is not None and not diff <= LOSS_TOL:
            notes.append(f"S={S}: step-1 losses of the LoRA runs differ by {diff:.2e} (> {LOSS_TOL:g})")
        print(f"| {S} | {fmt(tl)} | {fmt(tt)} | {fmt(tf)} | {fmt(ratio(tl, tt), '.2f')} "
              f"| {fmt(ratio(tl, tf), '.2f')} | {fmt(rl, '.2f')} | {fmt(rt, '.2f')} | {fmt(rf, '.2f')} "
              f"| {fmt(ratio(rl, rt), '.2f')} | {fmt(ratio(rl, rf), '.2f')} | {fmt(la, '.5f')} "
              f"| {fmt(lt, '.5f')} | {fmt(diff, '.1e')} |")
    print("\nRatios are autosp LoRA over the other run: < 1, autosp LoRA faster (or smaller). Peak RSS "
          "includes each run's fixed costs (imports, compile).")
    for n in notes:
        print("note:", n)


if __name__ == "__main__":
    main()
