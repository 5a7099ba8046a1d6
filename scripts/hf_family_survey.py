#!/usr/bin/env python3
"""Which decoder-only transformers families autosp imports: each family's tiny random model
(vocab 64, hidden 32, 2 layers, 4 query heads, its distinctive features on) is exported with
python/autosp/export.py, imported (`autosp dump --model X.pt2 --stage forward`) and trained 2
steps on the CPU (`autosp train --model X.pt2`), then the same 2 steps sequence-parallel on 2
MPI ranks, whose losses must be one process's (to 1e-5). A survey, not a test: the families autosp is
held to PyTorch's float64 results on are tests/fixtures/torch_export's; README.md ("Importing
a PyTorch model") has the last survey's table.

  ~/.cache/autosp/bench-venv/bin/python scripts/hf_family_survey.py [--autosp build/autosp]
      [--out DIR] [--only NAME ...] [--probes]

With the bench venv (scripts/install_bench_venv.sh: torch 2.x and transformers 4), or under
transformers 5 with the python of scripts/install_transformers5_venv.sh; about a minute.
Writes DIR/<name>.pt2, <name>.{export,dump,train}.log, results.json and results.md (DIR defaults
to a fresh temporary directory, printed).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import traceback

os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402
import transformers as T  # noqa: E402

torch.set_num_threads(1)
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
from autosp.export import export  # noqa: E402

OUT = None  # set by main()
AUTOSP = None
V = 64
C = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
         num_key_value_heads=2, max_position_embeddings=64)
NOKV = {k: v for k, v in C.items() if k != "num_key_value_heads"}
# BERT's layout as a causal LM (is_decoder): learned positions from the position_ids buffer,
# post-norm LayerNorms, the mask built as (1 - mask) * finfo.min, token types of one segment
BERT = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=64, is_decoder=True)


def families():
    """(name, model class name, config class name, config kwargs)."""
    return [
        ("llama", "LlamaForCausalLM", "LlamaConfig", dict(C)),
        ("mistral", "MistralForCausalLM", "MistralConfig", dict(C)),  # sliding_window 4096 default
        ("qwen3", "Qwen3ForCausalLM", "Qwen3Config", dict(C, head_dim=8)),  # q/k norms
        ("gemma2", "Gemma2ForCausalLM", "Gemma2Config",  # softcaps 50 / 30 default, sliding 4096
         dict(C, head_dim=8, query_pre_attn_scalar=8)),
        ("olmo", "OlmoForCausalLM", "OlmoConfig", dict(C)),  # non-parametric LayerNorm
        ("olmo2", "Olmo2ForCausalLM", "Olmo2Config", dict(C)),  # q/k norms, post-norms
        ("stablelm", "StableLmForCausalLM", "StableLmConfig", dict(C, hidden_size=64)),  # partial rotary 0.25 (head 16: 2 freqs), LayerNorm
        ("gpt_neox", "GPTNeoXForCausalLM", "GPTNeoXConfig", dict(NOKV, hidden_size=64)),  # rotary_pct .25 (head 16: 2 freqs), parallel residual
        ("granite", "GraniteForCausalLM", "GraniteConfig",  # Granite-3 style multipliers
         dict(C, embedding_multiplier=12.0, logits_scaling=8.0, residual_multiplier=0.22,
              attention_multiplier=0.0078125)),
        ("cohere", "CohereForCausalLM", "CohereConfig", dict(C)),  # logit_scale .0625, parallel block
        ("starcoder2", "Starcoder2ForCausalLM", "Starcoder2Config", dict(C)),  # biases, LayerNorm, gelu
        ("smollm3", "SmolLM3ForCausalLM", "SmolLM3Config", dict(C, no_rope_layer_interval=2)),  # NoPE layer 2
        ("glm", "GlmForCausalLM", "GlmConfig", dict(C, head_dim=8)),  # partial rotary .5, qkv bias
        ("glm4", "Glm4ForCausalLM", "Glm4Config", dict(C, head_dim=8)),
        ("helium", "HeliumForCausalLM", "HeliumConfig", dict(C, head_dim=8)),
        ("exaone4", "Exaone4ForCausalLM", "Exaone4Config", dict(C)),  # q/k norms, post norms, sliding 4096
        ("ernie4_5", "Ernie4_5ForCausalLM", "Ernie4_5Config", dict(C, head_dim=8)),
        ("arcee", "ArceeForCausalLM", "ArceeConfig", dict(C)),  # relu2 MLP
        ("nemotron", "NemotronForCausalLM", "NemotronConfig", dict(C)),  # LayerNorm1P, relu2, partial rotary
        ("phi3", "Phi3ForCausalLM", "Phi3Config", dict(C, sliding_window=None, rope_scaling=None)),
        ("gpt_bigcode", "GPTBigCodeForCausalLM", "GPTBigCodeConfig",  # multi-query
         dict(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_inner=64, n_positions=64)),
        ("falcon", "FalconForCausalLM", "FalconConfig",  # multi-query, parallel attn, rope
         dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64)),
        ("persimmon", "PersimmonForCausalLM", "PersimmonConfig", dict(NOKV)),  # qk LayerNorm, relu2, partial rotary
        ("opt", "OPTForCausalLM", "OPTConfig",  # learned positions (offset 2), relu
         dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=4,
              max_position_embeddings=64)),
        ("gptj", "GPTJForCausalLM", "GPTJConfig",  # interleaved partial rotary, parallel block
         dict(vocab_size=V, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64)),
        ("codegen", "CodeGenForCausalLM", "CodeGenConfig",
         dict(vocab_size=V, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64, n_ctx=64)),
        ("bloom", "BloomForCausalLM", "BloomConfig",  # alibi
         dict(vocab_size=V, hidden_size=32, n_layer=2, n_head=4)),
        ("gemma", "GemmaForCausalLM", "GemmaConfig", dict(C, head_dim=8)),  # (1 + w) norms, gelu tanh
        ("phi", "PhiForCausalLM", "PhiConfig", dict(NOKV)),  # partial rotary, parallel block, biases
        ("cohere2", "Cohere2ForCausalLM", "Cohere2Config", dict(C)),  # sliding and global (NoPE) layers
        ("olmo3", "Olmo3ForCausalLM", "Olmo3Config", dict(C)),  # sliding layers, q/k norms, post-norms
        ("seed_oss", "SeedOssForCausalLM", "SeedOssConfig", dict(C, head_dim=8)),  # qkv biases
        ("hunyuan_dense", "HunYuanDenseV1ForCausalLM", "HunYuanDenseV1Config", dict(C, head_dim=8)),  # q/k norms
        ("ministral", "MinistralForCausalLM", "MinistralConfig",  # a sliding and a full layer
         dict(C, head_dim=8, sliding_window=6, layer_types=["sliding_attention", "full_attention"])),
        ("apertus", "ApertusForCausalLM", "ApertusConfig", dict(C)),  # xIELU activation (learned scalars), q/k norms
        ("gpt_neo", "GPTNeoForCausalLM", "GPTNeoConfig",  # global and local (window 8) layers
         dict(vocab_size=V, hidden_size=32, num_layers=2, num_heads=4, max_position_embeddings=64,
              attention_types=[[["global", "local"], 1]], window_size=8)),
        ("mpt", "MptForCausalLM", "MptConfig",  # alibi
         dict(vocab_size=V, d_model=32, n_heads=4, n_layers=2, max_seq_len=64)),
        ("biogpt", "BioGptForCausalLM", "BioGptConfig",  # learned positions (offset 2), scaled embeddings
         dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
              max_position_embeddings=64)),
        ("vaultgemma", "VaultGemmaForCausalLM", "VaultGemmaConfig",  # Gemma 2's layout, softcaps
         dict(C, head_dim=8, query_pre_attn_scalar=8)),
        ("bitnet", "BitNetForCausalLM", "BitNetConfig", dict(C)),  # a norm inside the attention and the MLP, relu2
        ("bert", "BertLMHeadModel", "BertConfig", dict(BERT)),  # token types (row 0 broadcast)
        ("bert_generation", "BertGenerationDecoder", "BertGenerationConfig", dict(BERT)),  # no token types
        ("electra", "ElectraForCausalLM", "ElectraConfig", dict(BERT, embedding_size=32)),
        ("ernie", "ErnieForCausalLM", "ErnieConfig", dict(BERT)),  # task type ids (one task)
        ("big_bird", "BigBirdForCausalLM", "BigBirdConfig", dict(BERT, attention_type="original_full")),
        ("rembert", "RemBertForCausalLM", "RemBertConfig",  # token types of zeros(), own embedding sizes
         dict(BERT, input_embedding_size=32, output_embedding_size=32)),
        ("megatron_bert", "MegatronBertForCausalLM", "MegatronBertConfig", dict(BERT)),  # pre-norm
        ("openai_gpt", "OpenAIGPTLMHeadModel", "OpenAIGPTConfig",  # a stored mask: w * b - 1e4 (1 - b)
         dict(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64)),
        ("ctrl", "CTRLLMHeadModel", "CTRLConfig",  # a stored sinusoid table read at the positions
         dict(vocab_size=V, n_embd=32, dff=48, n_layer=2, n_head=4, n_positions=64)),
        ("doge", "DogeForCausalLM", "DogeConfig", dict(C)),  # dynamic mask attention (a bias from the values)
        # Mixture-of-experts (export.py's autosp::moe where the block is softmax top-k over SwiGLU experts)
        ("mixtral", "MixtralForCausalLM", "MixtralConfig", dict(C, num_local_experts=4, num_experts_per_tok=2)),
        ("qwen3_moe", "Qwen3MoeForCausalLM", "Qwen3MoeConfig",
         dict(C, head_dim=8, moe_intermediate_size=24, num_experts=4, num_experts_per_tok=2)),
        ("olmoe", "OlmoeForCausalLM", "OlmoeConfig", dict(C, num_experts=8, num_experts_per_tok=2)),
        ("flex_olmo", "FlexOlmoForCausalLM", "FlexOlmoConfig", dict(C, num_experts=4, num_experts_per_tok=2)),
        ("minimax", "MiniMaxForCausalLM", "MiniMaxConfig",  # lightning (linear) attention layers too
         dict(C, head_dim=8, num_local_experts=4, num_experts_per_tok=2)),
        ("ernie4_5_moe", "Ernie4_5_MoeForCausalLM", "Ernie4_5_MoeConfig",
         dict(C, head_dim=8, moe_intermediate_size=24, moe_num_experts=4, moe_k=2)),
        ("hunyuan_moe", "HunYuanMoEV1ForCausalLM", "HunYuanMoEV1Config",
         dict(C, head_dim=8, num_experts=4, moe_topk=2)),
        ("qwen2_moe", "Qwen2MoeForCausalLM", "Qwen2MoeConfig",  # a shared expert behind a sigmoid gate
         dict(C, moe_intermediate_size=24, shared_expert_intermediate_size=48, num_experts=4, num_experts_per_tok=2)),
        ("phimoe", "PhimoeForCausalLM", "PhimoeConfig", dict(C, num_local_experts=4, num_experts_per_tok=2)),
        ("granitemoe", "GraniteMoeForCausalLM", "GraniteMoeConfig",
         dict(C, num_local_experts=4, num_experts_per_tok=2)),
        ("granitemoeshared", "GraniteMoeSharedForCausalLM", "GraniteMoeSharedConfig",  # and a shared MLP
         dict(C, num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=48)),
        ("dots1", "Dots1ForCausalLM", "Dots1Config",  # DeepSeek-V3's router on Qwen3's attention
         dict(C, head_dim=8, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
              first_k_dense_replace=1, n_group=1, topk_group=1, n_shared_experts=1, routed_scaling_factor=1.0)),
        ("glm4_moe", "Glm4MoeForCausalLM", "Glm4MoeConfig",  # sigmoid router, correction bias, groups
         dict(C, head_dim=8, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=24,
              n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1, routed_scaling_factor=2.5,
              partial_rotary_factor=0.5)),
        ("deepseek_v3", "DeepseekV3ForCausalLM", "DeepseekV3Config",
         dict(C, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, first_k_dense_replace=0,
              n_group=1, topk_group=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=8,
              v_head_dim=8)),
        ("gpt_oss", "GptOssForCausalLM", "GptOssConfig",  # attention sinks, sliding layers, YaRN, clamped-GLU experts
         dict(C, head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
              layer_types=["sliding_attention", "full_attention"])),
        ("deepseek_v2", "DeepseekV2ForCausalLM", "DeepseekV2Config",  # complex rotary; softmax router, groups
         dict(C, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, first_k_dense_replace=0,
              n_group=2, topk_group=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=8,
              v_head_dim=8, routed_scaling_factor=2.0, topk_method="group_limited_greedy")),
        ("llama4", "Llama4ForCausalLM", "Llama4TextConfig",  # chunked attention, NoPE temperature, input-weighted experts
         dict(C, head_dim=8, num_local_experts=4, num_experts_per_tok=1, attention_chunk_size=8,
              no_rope_layer_interval=2, floor_scale=8)),
        ("aria", "AriaTextForCausalLM", "AriaTextConfig",  # experts [E, H, 2 I] (transposed), shared experts
         dict(C, moe_num_experts=4, moe_topk=2, moe_num_shared_experts=1)),
        ("longcat_flash", "LongcatFlashForCausalLM", "LongcatFlashConfig",  # latent attention, zero experts
         dict(vocab_size=V, hidden_size=32, num_layers=1, num_hidden_layers=2, num_attention_heads=4,
              kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=4, head_dim=4, qk_nope_head_dim=8, v_head_dim=8,
              ffn_hidden_size=48, expert_ffn_hidden_size=24, n_routed_experts=4, zero_expert_num=2, moe_topk=2)),
        ("dbrx", "DbrxForCausalLM", "DbrxConfig",
         dict(vocab_size=V, d_model=32, n_heads=4, n_layers=2, max_seq_len=64,
              ffn_config={"ffn_hidden_size": 48, "moe_num_experts": 4, "moe_top_k": 2},
              attn_config={"kv_n_heads": 2} if T.__version__ < "5" else
              # (transformers 5's DBRX reads rope_theta there and clamps q/k/v by clip_qkv, which must be set)
              {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0})),
    ]


def probes():
    """Variants with the first blocker switched off, to see the next one (not part of the table)."""
    return [
        ("probe_stablelm_mha", "StableLmForCausalLM", "StableLmConfig",
         dict(C, hidden_size=64, num_key_value_heads=4)),  # no repeat_kv (StableLM's default kv = heads)
        ("probe_gpt_neox_rotary2", "GPTNeoXForCausalLM", "GPTNeoXConfig", dict(NOKV)),  # head 8 x .25: one frequency
    ]


def zero_dropouts_and_ids(cfg):
    """Dropout off (export.py's autosp attention refuses attention dropout, and it is not a family
    feature); token ids that index a vocab of 64."""
    for k, v in list(vars(cfg).items()):
        if ("dropout" in k or "pdrop" in k or k == "layerdrop") and isinstance(v, float) and v != 0.0:
            setattr(cfg, k, 0.0)
    for k in ("pad_token_id", "bos_token_id", "eos_token_id"):
        v = getattr(cfg, k, None)
        if isinstance(v, int) and v >= V:
            setattr(cfg, k, 0 if k == "pad_token_id" else 1)
        elif isinstance(v, list):
            setattr(cfg, k, [x if x < V else 1 for x in v])


def run(cmd, log, timeout=600):
    try:
        r = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        out, rc = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = f"TIMEOUT after {timeout}s\n{e.stdout or ''}{e.stderr or ''}", 124
    with open(log, "w") as f:
        f.write(f"$ {cmd}\nrc={rc}\n{out}")
    return rc, out


def first_error_lines(out, n=2):
    lines = [l for l in out.splitlines() if l.strip() and "FutureWarning" not in l and "warnings.warn" not in l]
    for i, l in enumerate(lines):
        if "rror" in l or "unsupported" in l.lower() or "not supported" in l.lower() or "cannot" in l.lower():
            return lines[i:i + n]
    return lines[:n]


def write_cli_inputs():
    with open(f"{OUT}/tokens.bin", "wb") as f:
        for i in range(2049):
            f.write((1 + (i * 7) % 13).to_bytes(4, "little"))
    with open(f"{OUT}/ds.json", "w") as f:
        json.dump({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
                   "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
                   "data": {"shuffle": False}}, f)
    with open(f"{OUT}/ds_sp2.json", "w") as f:
        json.dump({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
                   "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
                   "compile": {"deepcompile": True, "passes": ["autosp"]}, "sequence_parallel_size": 2,
                   "data": {"shuffle": False}}, f)


def survey(name, model_cls, cfg_cls, kw):
    res = {"family": model_cls, "name": name}
    if not hasattr(T, model_cls):
        res["skipped"] = "not in transformers " + T.__version__
        return res
    pt2 = f"{OUT}/{name}.pt2"
    try:
        cfg = getattr(T, cfg_cls)(**kw)
        zero_dropouts_and_ids(cfg)
        torch.manual_seed(0)
        model = getattr(T, model_cls)(cfg)
        model.train()
        torch.manual_seed(0)
        export(model, pt2, batch=2, seq_len=16)
        res["export"] = True
    except Exception as e:  # noqa: BLE001
        res["export"] = False
        msg = f"{type(e).__name__}: {e}"
        res["export_error"] = msg.strip().splitlines()[0][:400]
        with open(f"{OUT}/{name}.export.log", "w") as f:
            f.write(traceback.format_exc())
        return res
    rc, out = run(f"{AUTOSP} dump --model {pt2} --stage forward --seq-len 16 --batch 2",
                  f"{OUT}/{name}.dump.log")
    res["import"] = rc == 0
    if rc != 0:
        res["import_error"] = first_error_lines(out)
        return res
    metrics = f"{OUT}/{name}.metrics.jsonl"
    if os.path.exists(metrics):
        os.remove(metrics)
    rc, out = run(f"{AUTOSP} train --config {OUT}/ds.json --model {pt2} --data {OUT}/tokens.bin "
                  f"--seq-len 16 --steps 2 --metrics {metrics}", f"{OUT}/{name}.train.log")
    res["train"] = rc == 0
    if rc != 0:
        res["train_error"] = first_error_lines(out)
    elif os.path.exists(metrics):
        res["losses"] = [json.loads(l)["loss"] for l in open(metrics) if l.strip()]
    if not res["train"] or not res.get("losses"):
        return res
    # The same 2 steps sequence-parallel on 2 MPI ranks: the losses of one process, to fp32
    # reordering.
    metrics_sp = f"{OUT}/{name}.sp2.metrics.jsonl"
    if os.path.exists(metrics_sp):
        os.remove(metrics_sp)
    mpirun = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 2 --oversubscribe"
    rc, out = run(f"{mpirun} {AUTOSP} train --config {OUT}/ds_sp2.json --model {pt2} --data {OUT}/tokens.bin "
                  f"--seq-len 16 --steps 2 --metrics {metrics_sp}", f"{OUT}/{name}.sp2.log")
    if rc != 0 or not os.path.exists(metrics_sp):
        res["sp2"] = False
        res["sp2_error"] = first_error_lines(out)
        return res
    sp = [json.loads(l)["loss"] for l in open(metrics_sp) if l.strip()]
    res["sp2_losses"] = sp
    res["sp2"] = len(sp) == len(res["losses"]) and all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(sp, res["losses"]))
    return res


def main():
    global OUT, AUTOSP
    p = argparse.ArgumentParser()
    p.add_argument("--autosp", default=os.path.join(ROOT, "build", "autosp"))
    p.add_argument("--out", help="output directory (default: a fresh temporary one)")
    p.add_argument("--only", nargs="*")
    p.add_argument("--probes", action="store_true", help="run the probe variants instead of the families")
    args = p.parse_args()
    AUTOSP = os.path.abspath(args.autosp)
    OUT = os.path.abspath(args.out) if args.out else tempfile.mkdtemp(prefix="autosp_family_survey_")
    os.makedirs(OUT, exist_ok=True)
    print(f"hf_family_survey: transformers {T.__version__}, torch {torch.__version__}, into {OUT}", flush=True)
    write_cli_inputs()
    path = f"{OUT}/results.json"
    results = json.load(open(path)) if os.path.exists(path) else {}
    for name, mc, cc, kw in (probes() if args.probes else families()):
        if args.only and name not in args.only:
            continue
        r = survey(name, mc, cc, kw)
        results[name] = r
        print(json.dumps(r), flush=True)
        json.dump(results, open(path, "w"), indent=1)
    order = [f[0] for f in families() + probes()]
    with open(f"{OUT}/results.md", "w") as f:
        f.write("| family | export | import | train (losses) | SP 2 = SP 1 | error |\n|---|---|---|---|---|---|\n")
        for n in order:
            if n not in results:
                continue
            r = results[n]
            yn = lambda k: "-" if k not in r else ("yes" if r[k] else "NO")  # noqa: E731
            err = r.get("export_error") or " / ".join(r.get("import_error") or r.get("train_error") or
                                                     r.get("sp2_error") or [])
            losses = ", ".join(f"{x:.4f}" for x in r.get("losses", []))
            f.write(f"| {r['family']} | {yn('export')} | {yn('import')} | {yn('train')} {losses} | {yn('sp2')} | "
                    f"{err} |\n")


if __name__ == "__main__":
    main()
