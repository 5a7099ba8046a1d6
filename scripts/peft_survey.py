#!/usr/bin/env python3
"""Which PEFT methods autosp trains, and whether its first step is PyTorch's (a survey, not a test;
the llama_lora, llama_dora and llama_vera fixtures are the tests). For each method: a tiny transformers Llama (vocab 64, hidden
32, 2 layers, 4 heads, 2 kv heads) under `get_peft_model`, its trainable tensors drawn at random
(LoRA's B is zero at init, which would leave A's gradient zero), exported with
python/autosp/export.py, then one step of `autosp train` on a batch of 2 x 16 tokens against the
same forward and backward in PyTorch fp32: the loss (all 16 positions against the next tokens)
and the gradient norm over the trainable parameters. Agreement is fp32 rounding (~1e-7).

  ~/.cache/autosp/bench-venv/bin/python scripts/peft_survey.py [--autosp build/autosp] [--out DIR]

One JSON line per method: exported, imported, the two losses and norms, their relative
differences; or the export's or autosp's error.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import warnings

import torch
import torch.nn.functional as F
import transformers as T
from peft import (AdaLoraConfig, BOFTConfig, FourierFTConfig, HRAConfig, IA3Config, LNTuningConfig, LoHaConfig,
                  LoKrConfig, LoraConfig, OFTConfig, TrainableTokensConfig, VeraConfig, get_peft_model)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
from autosp.export import export  # noqa: E402

V, S, B = 64, 16, 2
CONFIG = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2)
METHODS = {
    "lora": LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    "rslora": LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], use_rslora=True),
    "lora_all_linear": LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"),
    "lora_embedding": LoraConfig(r=4, lora_alpha=8, target_modules=["embed_tokens", "q_proj"]),
    "lora_modules_to_save": LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], modules_to_save=["lm_head"]),
    "ia3": IA3Config(target_modules=["k_proj", "v_proj", "down_proj"], feedforward_modules=["down_proj"]),
    "dora": LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], use_dora=True),
    "dora_all_linear": LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", use_dora=True),
    "pissa": LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights="pissa"),
    "vera": VeraConfig(r=4, target_modules=["q_proj", "v_proj"]),
    "ln_tuning": LNTuningConfig(target_modules=["input_layernorm", "post_attention_layernorm"]),
    "adalora": AdaLoraConfig(init_r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], total_step=10),
    "loha": LoHaConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]),
    "lokr": LoKrConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]),
    "oft": OFTConfig(r=0, oft_block_size=8, target_modules=["q_proj", "v_proj"]),
    "boft": BOFTConfig(boft_block_size=4, target_modules=["q_proj", "v_proj"]),
    "hra": HRAConfig(r=4, target_modules=["q_proj", "v_proj"]),
    "fourierft": FourierFTConfig(n_frequency=16, target_modules=["q_proj", "v_proj"]),
    "trainable_tokens": TrainableTokensConfig(target_modules=["embed_tokens"], token_indices=[1, 2, 3]),
}


def survey(name, method, d, autosp, rows):
    res = {"method": name}
    torch.manual_seed(0)
    model = get_peft_model(T.LlamaForCausalLM(T.LlamaConfig(**CONFIG)), method)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.copy_(0.1 * torch.randn(p.shape))
    model.train()
    pt2 = os.path.join(d, f"{name}.pt2")
    try:
        export(model, pt2)
    except Exception as e:  # noqa: BLE001
        res["export"], res["export_error"] = False, f"{type(e).__name__}: {e}".splitlines()[0][:400]
        return res
    res["export"] = True
    model.set_attn_implementation("eager")
    logits = model(input_ids=rows[:, :S]).logits
    loss = F.cross_entropy(logits.reshape(-1, V), rows[:, 1:].reshape(-1))
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], float("inf")).item()
    metrics = os.path.join(d, f"{name}.jsonl")
    r = subprocess.run([autosp, "train", "--config", os.path.join(d, "ds.json"), "--model", pt2, "--data",
                        os.path.join(d, "tokens.bin"), "--seq-len", str(S), "--steps", "1", "--metrics", metrics,
                        "--overwrite"], capture_output=True, text=True)
    res["import"] = r.returncode == 0
    if r.returncode != 0:
        res["import_error"] = [ln for ln in r.stderr.splitlines() if ln.strip()][:2]
        return res
    m = json.loads(open(metrics).read().splitlines()[0])
    res.update(torch_loss=loss.item(), autosp_loss=m["loss"], loss_rel=abs(m["loss"] / loss.item() - 1),
               torch_grad_norm=norm, autosp_grad_norm=m["grad_norm"], grad_norm_rel=abs(m["grad_norm"] / norm - 1))
    return res


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--autosp", default=os.path.join(ROOT, "build", "autosp"))
    p.add_argument("--out", help="output directory (default: a fresh temporary one)")
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    d = os.path.abspath(args.out) if args.out else tempfile.mkdtemp(prefix="autosp_peft_survey_")
    os.makedirs(d, exist_ok=True)
    # autosp's sample k is tokens [k S, k S + S + 1): the same rows as the reference's
    tokens = torch.randint(1, V, (B * S + 1,), generator=torch.Generator().manual_seed(1))
    rows = torch.stack([tokens[k * S:k * S + S + 1] for k in range(B)])
    with open(os.path.join(d, "tokens.bin"), "wb") as f:
        f.write(struct.pack(f"<{len(tokens)}I", *tokens.tolist()))
    with open(os.path.join(d, "ds.json"), "w") as f:
        json.dump({"train_micro_batch_size_per_gpu": B, "gradient_accumulation_steps": 1,
                   "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "data": {"shuffle": False}}, f)
    print(f"peft_survey: into {d}", flush=True)
    for name, method in METHODS.items():
        print(json.dumps(survey(name, method, d, os.path.abspath(args.autosp), rows)), flush=True)


if __name__ == "__main__":
    main()
