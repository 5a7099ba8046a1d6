#!/usr/bin/env bash
# The cuda backend's GPU check (issues 13 and 42): one command, under 9 minutes on one H200.
#
#   scripts/gpu_check.sh [--bundle DIR|FILE.tar.xz] [--out FILE] [--quick]
#
# Stages, each under its own timeout; the result JSON is rewritten after every stage, so a
# stage that fails or times out leaves the others' results and its own status in it:
#   build       configure and build autosp, cuda_ops_test and bench_cuda (build-gpu/), or,
#               with --bundle DIR, use the binaries scripts/gpu_bundle.sh made on a build
#               machine (for a GPU machine without autosp's build dependencies); --bundle
#               FILE.tar.xz, its packed form (the one a device run carries), is unpacked first
#   op_tests    cuda_ops_test: every op on cuda vs the CPU backend (f32 and bf16) and vs
#               finite differences, the attention kernels with document ids, AdamW, NCCL
#   cudnn_attention  cuda_ops_test's CudnnAttention.*: cuDNN's fused attention (bf16) vs the
#               double reference and the blocks, its THD kernel, graph cache and workspace
#   llama_bf16  the Llama reference test in f32 and bf16 (in the same binary)
#   train_cli   `autosp train --backend cuda` vs `--backend cpu` on the reference model: the
#               same losses (f32, to 1e-4 relative)
#   train_bf16  `autosp train --backend cuda` with bf16 enabled (the device-resident step) vs
#               the fp32 CPU run over 20 steps (within bf16 tolerance), and a save at step 10
#               resumed to step 20 on the device: the same losses and checkpoint, bitwise (with
#               the blocked attention: cuDNN 9.19's backward is not deterministic)
#   imported    `autosp train --backend cuda` vs `--backend cpu` on 15 imported programs (f32, 4
#               steps, 1e-4 relative): Gemma 2's fixture (both logit softcaps: the blocks' capped
#               attention, the capped loss rows, no cuDNN), OPT's (offset positions, merged rows),
#               BLOOM's (ALiBi: the blocks add the bias, slopes by value), DeepSeek-V3's (latent
#               attention: values padded, the key's rotary expanded; the grouped sigmoid router
#               with its bias, moe_routing.h on the device), GLM-4.5-MoE's of transformers 5
#               (stacked experts read in place, the same router), gpt-oss's (the sinks' fold
#               and gradient, its experts' clamped GLU and biases), DBRX's (experts stacked
#               apart, down transposed; clamp), Llama 4's, LongCat-Flash's, CTRL's, and PEFT's LoRA,
#               DoRA (its detached weight norm: stop_gradient, vector_norm and div on the device)
#               and VeRA (shared projections, constants), scalar_gain (one-element scalars) and
#               normalized_gpt (vector_norm and div over activation rows);
#               then LoRA's and DoRA's bf16 device step against the fp32 CPU run (5e-2)
#   sp_one_gpu  SP 2 and 4 ranks sharing the GPU (collectives staged over MPI) give SP 1's losses
#               over 5 steps: Mistral's fixture (1 KV head, a window), packed documents, f32 (1e-5)
#               and bf16 (the device-resident step); SP 2 with compile.overlap (the all-to-alls
#               on a communication stream) gives SP 2's losses bit for bit, and its profile line
#   bench       bench_cuda (the trainer's bf16 step) vs bench/bench_cuda_torch.py, Llama 3.2
#               1B shape, S = 4096 and 16384: step time ratio (targets 0.8 and 0.95), peak
#               memory ratio, MFU of each (target 45% at 16384), and autosp's per-op profile
#               (rows and table); at 4096 also the fused row kernels against the reference ones
#   max_seq     the longest S per checkpoint policy whose step runs: autosp none/full/sac (one
#               trainer step at each S, doubling, device memory used vs the plan), torch
#               none/full (one training step each, doubling until OOM); time-boxed
# The stages share a time budget (GPU_CHECK_BUDGET, 520 s): a stage gets at most what is left.
# Writes FILE (default docs/gpu_check.json; also $OUT/gpu_check.json when $OUT is set).
# "status" is "passed" only when every stage passed; `autosp --version` reports it after
# the file is committed and the build reconfigured.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

bundle=""
result="docs/gpu_check.json"
quick=0
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) bundle="$2"; shift 2 ;;
    --out) result="$2"; shift 2 ;;
    --quick) quick=1; shift ;;
    *) echo "gpu_check: unknown argument $1" >&2; exit 2 ;;
  esac
done
# The packed bundle (gpu_bundle.sh's BUNDLE.tar.xz): unpacked beside the tree's temporary files.
if [ -n "$bundle" ] && [ -f "$bundle" ]; then
  case "$bundle" in
    *.tar.xz) ;;
    *) echo "gpu_check: --bundle $bundle is a file, not a .tar.xz of scripts/gpu_bundle.sh" >&2; exit 2 ;;
  esac
  unpacked=$(mktemp -d "${TMPDIR:-/tmp}/gpu_bundle.XXXXXX")
  tar -C "$unpacked" -xJf "$bundle" || { echo "gpu_check: could not unpack $bundle" >&2; exit 2; }
  bundle="$unpacked"
fi
if [ -n "$bundle" ] && [ ! -x "$bundle/bin/autosp" ]; then
  echo "gpu_check: --bundle $bundle has no bin/autosp (scripts/gpu_bundle.sh makes one)" >&2
  exit 2
fi

python=${AUTOSP_PYTHON:-python3}
export AUTOSP_PYTHON="$python"
logs="${OUT:-$root/build-gpu}/gpu_check_logs"
mkdir -p "$logs" "$(dirname "$result")"
stages_file="$logs/stages.jsonl"
: > "$stages_file"
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
# AUTOSP_COMMIT names the commit where the checkout's git metadata is not the tree's (a tree
# copied to a GPU machine beside an older .git, say).
commit=${AUTOSP_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1 || true)
[ -n "$gpu" ] || gpu="no GPU found by nvidia-smi"
overall="passed"

# Rewrites the result file from the stages so far (python: the JSON is built, not pasted).
write_result() {
  local status="$1"
  "$python" - "$result" "$stages_file" "$status" "$gpu" "$commit" "$started" <<'EOF'
import json, sys, datetime
out, stages_file, status, gpu, commit, started = sys.argv[1:7]
stages = {}
for line in open(stages_file):
    line = line.strip()
    if line:
        s = json.loads(line)
        stages[s["stage"]] = s
doc = {"status": status, "gpu": gpu, "commit": commit, "started": started,
       "finished": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
       "stages": stages}
with open(out, "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
EOF
  if [ -n "${OUT:-}" ] && ! [ "$result" -ef "$OUT/gpu_check.json" ]; then cp "$result" "$OUT/gpu_check.json"; fi
}

# record STAGE STATUS SECONDS [JSON-FILE-WITH-DETAILS]
record() {
  local details="{}"
  if [ $# -ge 4 ] && [ -s "$4" ]; then details=$(cat "$4"); fi
  "$python" - "$1" "$2" "$3" "$details" >> "$stages_file" <<'EOF'
import json, sys
stage, status, seconds, details = sys.argv[1:5]
try:
    d = json.loads(details)
except ValueError:
    d = {"unparsed": details[:2000]}
print(json.dumps({"stage": stage, "status": status, "seconds": float(seconds), "details": d}))
EOF
  [ "$2" = "passed" ] || overall="failed"
  write_result "running"
}

# The whole check's time (GPU_CHECK_BUDGET seconds, default 520: under 9 minutes with the
# last stage's kill grace): a stage gets at most what is left of it, and a stage with under
# 15 s left is not started (status "timeout", said in its log), so the check ends in time
# whatever a stage does.
budget=${GPU_CHECK_BUDGET:-520}
check_start=$(date +%s)

# run_stage NAME TIMEOUT_SECONDS COMMAND...: status passed / failed / timeout.
run_stage() {
  local name="$1" limit="$2"
  shift 2
  local t0 rc=0 left
  t0=$(date +%s)
  left=$(( budget - (t0 - check_start) ))
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== gpu_check: $name (limit ${limit}s)"
  if [ "$limit" -lt 15 ]; then
    echo "not started: ${left} s left of the check's ${budget} s (GPU_CHECK_BUDGET)" > "$logs/$name.log"
    rc=124
  else
    timeout --kill-after=10 "$limit" "$@" > "$logs/$name.log" 2>&1 || rc=$?
  fi
  local status="passed"
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then status="timeout"; elif [ "$rc" -ne 0 ]; then status="failed"; fi
  echo "   $status (rc $rc, $(( $(date +%s) - t0 )) s); log: $logs/$name.log"
  tail -n 5 "$logs/$name.log" || true
  STAGE_STATUS="$status"
  STAGE_SECONDS=$(( $(date +%s) - t0 ))
}

write_result "running"

# Without a GPU the stages still run (a dry run of this script), but nothing is verified:
# the result is "failed" whatever they say.
if ! nvidia-smi -L > /dev/null 2>&1; then
  echo "gpu_check: no GPU (nvidia-smi -L failed): a dry run, the result will be 'failed'"
  echo '{"reason": "nvidia-smi found no GPU: a dry run verifies nothing"}' > "$logs/gpu.json"
  record gpu failed 0 "$logs/gpu.json"
fi

# ---- build ---------------------------------------------------------------------------------
if [ -n "$bundle" ]; then
  bin="$bundle/bin"
  # NCCL and cuBLAS from the machine: the CUDA toolkit's, and PyTorch's pip wheels'.
  nccl_dir=$("$python" -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null || true)
  cublas_dir=$("$python" -c 'import os, nvidia.cublas as n; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null || true)
  # cuDNN and NVRTC (a build with cuDNN attention links both; gpu_bundle.sh leaves them out): the
  # CUDA toolkit's, else PyTorch's wheels'.
  cudnn_dir=$("$python" -c 'import os, nvidia.cudnn as n; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null || true)
  nvrtc_dir=$("$python" -c 'import os, nvidia.cuda_nvrtc as n; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null || true)
  export LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64:${nccl_dir}:${cublas_dir}:${cudnn_dir}:${nvrtc_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # cuBLAS is opened at run time (src/runtime/cuda_blas.h): --version says whether it loads.
  run_stage build 60 bash -c '"$0" --version | tee /dev/stderr | grep -q "cuBLAS [0-9]"' "$bin/autosp"
else
  bin="$root/build-gpu"
  build() {
    set -euo pipefail  # exported functions run in a fresh bash: no inherited -e
    cmake -S "$root" -B "$root/build-gpu" -DCMAKE_BUILD_TYPE=Release -DAUTOSP_CUDA=ON
    cmake --build "$root/build-gpu" -j "$(nproc)" --target autosp cuda_ops_test bench_cuda
    "$root/build-gpu/autosp" --version | tee /dev/stderr | grep -q "cuBLAS [0-9]"
  }
  export -f build
  export root
  run_stage build 300 bash -c build
fi
echo "{\"bin\": \"$bin\"}" > "$logs/build.json"
record build "$STAGE_STATUS" "$STAGE_SECONDS" "$logs/build.json"
if [ "$STAGE_STATUS" != "passed" ]; then write_result "failed"; echo "gpu_check: build failed"; exit 1; fi

# ---- the op-test matrix, then the Llama reference test --------------------------------------
gtest_summary() {  # LOG -> JSON counts
  "$python" - "$1" <<'EOF'
import json, re, sys
text = open(sys.argv[1], errors="replace").read()
def count(tag):
    m = re.search(r"\[  " + tag + r"  \] (\d+) test", text)
    return int(m.group(1)) if m else 0
errors = re.findall(r"^\S+ +\S+ +y\d+ normalised error .*$|^.* d\S+: \|fd - cuda\|.*$|^cuda \S+ vs float64.*$",
                    text, re.M)
failed = re.findall(r"^\[  FAILED  \] (\S+)", text, re.M)
skipped = set(re.findall(r"^\[  SKIPPED \] (\S+)$", text, re.M))
print(json.dumps({"passed": count("PASSED"), "skipped": len(skipped),
                  "failed": sorted(set(failed)), "measured": errors[:400]}))
EOF
}
run_stage op_tests 120 "$bin/cuda_ops_test" --gtest_filter='-CudaLlamaReference.*:CudnnAttention.*'
gtest_summary "$logs/op_tests.log" > "$logs/op_tests.json" || echo '{}' > "$logs/op_tests.json"
record op_tests "$STAGE_STATUS" "$STAGE_SECONDS" "$logs/op_tests.json"

# cuDNN's fused attention against the double reference and the blocks, its THD layout kernel,
# its graph cache and its workspace plan: a stage of its own, since each new shape builds cuDNN
# graphs (NVRTC compiles, seconds each). Its log has the measured errors and workspaces.
run_stage cudnn_attention 180 "$bin/cuda_ops_test" --gtest_filter='CudnnAttention.*'
gtest_summary "$logs/cudnn_attention.log" > "$logs/cudnn_attention.json" || echo '{}' > "$logs/cudnn_attention.json"
record cudnn_attention "$STAGE_STATUS" "$STAGE_SECONDS" "$logs/cudnn_attention.json"

run_stage llama_bf16 120 "$bin/cuda_ops_test" --gtest_filter='CudaLlamaReference.*'
gtest_summary "$logs/llama_bf16.log" > "$logs/llama_bf16.json" || echo '{}' > "$logs/llama_bf16.json"
record llama_bf16 "$STAGE_STATUS" "$STAGE_SECONDS" "$logs/llama_bf16.json"

# ---- the CLI trains on cuda as on the CPU ---------------------------------------------------
train_cli() {
  set -euo pipefail  # exported functions run in a fresh bash: no inherited -e
  local dir="$logs/train_cli"
  rm -rf "$dir"
  mkdir -p "$dir"
  "$AUTOSP_PYTHON" tests/reference/llama_reference.py --out "$dir/ref" --tied 0 --rope llama3 --steps 4
  for backend in cpu cuda; do
    "$bin/autosp" train --backend "$backend" --config "$dir/ref/ds_config.json" --model "$dir/ref" \
      --data "$dir/ref/tokens.bin" --seq-len 16 --steps 4 --metrics "$dir/$backend.jsonl"
  done
  "$AUTOSP_PYTHON" - "$dir/cpu.jsonl" "$dir/cuda.jsonl" > "$logs/train_cli.json" <<'EOF'
import json, sys
cpu = [json.loads(l)["loss"] for l in open(sys.argv[1]) if l.strip()]
gpu = [json.loads(l)["loss"] for l in open(sys.argv[2]) if l.strip()]
worst = max(abs(a - b) / max(abs(a), 1e-30) for a, b in zip(cpu, gpu))
print(json.dumps({"cpu_losses": cpu, "cuda_losses": gpu, "worst_relative": worst}))
# f32 on both backends, the same graph: differences are summation order only (~1e-6);
# 1e-4 relative over 4 AdamW steps leaves room for their growth.
sys.exit(0 if len(cpu) == len(gpu) == 4 and worst < 1e-4 else 1)
EOF
}
export -f train_cli
export bin logs
run_stage train_cli 90 bash -c train_cli
record train_cli "$STAGE_STATUS" "$STAGE_SECONDS" "$logs/train_cli.json"

# ---- bf16 on the device: the loss curve, and a save resumed bitwise ----------------------------
train_bf16() {
  set -euo pipefail  # exported functions run in a fresh bash: no inherited -e
  local dir="$logs/train_bf16"
  rm -rf "$dir"
  mkdir -p "$dir"
  "$AUTOSP_PYTHON" tests/reference/llama_reference.py --out "$dir/ref" --tied 0 --rope llama3 --steps 4
  "$AUTOSP_PYTHON" -c 'import json, sys; c = json.load(open(sys.argv[1])); c["bf16"] = {"enabled": True}; json.dump(c, open(sys.argv[2], "w"))' \
    "$dir/ref/ds_config.json" "$dir/bf16.json"
  local common=(--model "$dir/ref" --data "$dir/ref/tokens.bin" --seq-len 16)
  "$bin/autosp" train --backend cpu --config "$dir/ref/ds_config.json" "${common[@]}" --steps 20 --metrics "$dir/cpu.jsonl"
  "$bin/autosp" train --backend cuda --config "$dir/bf16.json" "${common[@]}" --steps 20 --metrics "$dir/cuda.jsonl"
  # Bitwise across a resume needs deterministic kernels: cuDNN 9.19's attention backward adds dQ
  # with atomics (its deterministic one needs an S^2 workspace), so these runs take the blocks.
  AUTOSP_ATTENTION=blocks "$bin/autosp" train --backend cuda --config "$dir/bf16.json" "${common[@]}" --steps 20 \
    --metrics "$dir/blocks.jsonl" --save "$dir/straight"
  AUTOSP_ATTENTION=blocks "$bin/autosp" train --backend cuda --config "$dir/bf16.json" "${common[@]}" --steps 10 \
    --save "$dir/half"
  AUTOSP_ATTENTION=blocks "$bin/autosp" train --backend cuda --config "$dir/bf16.json" "${common[@]}" --steps 20 \
    --resume "$dir/half" --metrics "$dir/resumed.jsonl" --save "$dir/resumed"
  "$AUTOSP_PYTHON" - "$dir" > "$logs/train_bf16.json" <<'EOF'
import json, sys, os
d = sys.argv[1]
def losses(name):
    return {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(os.path.join(d, name)) if l.strip()}
cpu, gpu, blocks, resumed = (losses(f"{n}.jsonl") for n in ("cpu", "cuda", "blocks", "resumed"))
worst = max(abs(cpu[s] - g[s]) / abs(cpu[s]) for g in (gpu, blocks) for s in cpu)
same_losses = all(resumed[s] == blocks[s] for s in resumed)
files = ("model.safetensors", "optimizer.safetensors")
same_files = all(open(os.path.join(d, "straight", f), "rb").read() == open(os.path.join(d, "resumed", f), "rb").read()
                 for f in files)
print(json.dumps({"cpu_fp32_losses": [cpu[s] for s in sorted(cpu)], "cuda_bf16_losses": [gpu[s] for s in sorted(gpu)],
                  "cuda_bf16_blocks_losses": [blocks[s] for s in sorted(blocks)],
                  "worst_relative": worst, "resumed_steps": sorted(resumed),
                  "resumed_losses_bitwise": same_losses, "resumed_checkpoint_bitwise": same_files}))
# bf16 against fp32 from the same weights: bf16 keeps 8 significant bits (2^-9 relative per
# rounding) of every activation and gradient, and the weights the step reads are rounded the
# same way each step; over 20 AdamW steps at lr 1e-2 on this 20k-parameter model the loss
# curves part by a few percent at most. 5e-2 relative is the first run's bound: set it from
# the worst_relative this stage prints.
sys.exit(0 if len(cpu) == len(gpu) == len(blocks) == 20 and len(resumed) == 10 and worst < 5e-2 and same_losses
         and same_files else 1)
EOF
}
export -f train_bf16
run_stage train_bf16 150 bash -c train_bf16
record train_bf16 "$STAGE_STATUS" "$STAGE_SECONDS" "$logs/train_bf16.json"

# ---- imported programs on cuda: Gemma 2's softcaps (attention on the blocks, the capped loss
# rows), OPT's offset positions and merged rows, BLOOM's ALiBi, DeepSeek-V3's latent attention
# and grouped router, GLM-4.5-MoE's stacked experts, gpt-oss's sinks and experts, DBRX's experts and
# clamp, Llama 4's chunks, temperature and input-weighted experts, LongCat-Flash's zero experts,
# CTRL's stored position table and LoRA's frozen base weights (constants of the graph), trained as
# on the CPU; and LoRA in bf16 on the device step (its constants a bf16 copy on the device) --------
imported() {
  set -euo pipefail  # exported functions run in a fresh bash: no inherited -e
  local dir="$logs/imported"
  rm -rf "$dir"
  mkdir -p "$dir"
  "$AUTOSP_PYTHON" - "$dir" <<'EOF'
import json, os, struct, sys
d = sys.argv[1]
tokens = [1 + (i * 7) % 13 for i in range(2049)]  # a sequence of period 13 over ids 1..13 (vocab 64)
open(os.path.join(d, "tokens.bin"), "wb").write(struct.pack(f"<{len(tokens)}I", *tokens))
json.dump({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
           "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}}, open(os.path.join(d, "ds.json"), "w"))
EOF
  for model in gemma2 opt bloom deepseek_v3 glm4_moe_tf5 gpt_oss dbrx llama4 longcat_flash ctrl llama_lora llama_dora \
      llama_vera scalar_gain normalized_gpt; do
    for backend in cpu cuda; do
      "$bin/autosp" train --backend "$backend" --config "$dir/ds.json" \
        --model "tests/fixtures/torch_export/$model/model.pt2" --data "$dir/tokens.bin" --seq-len 32 --steps 4 \
        --metrics "$dir/$model.$backend.jsonl"
    done
  done
  "$AUTOSP_PYTHON" -c 'import json, sys; c = json.load(open(sys.argv[1])); c["bf16"] = {"enabled": True}; json.dump(c, open(sys.argv[2], "w"))' \
    "$dir/ds.json" "$dir/bf16.json"
  for model in llama_lora llama_dora; do
    "$bin/autosp" train --backend cuda --config "$dir/bf16.json" --model "tests/fixtures/torch_export/$model/model.pt2" \
      --data "$dir/tokens.bin" --seq-len 32 --steps 4 --metrics "$dir/$model.bf16.jsonl"
  done
  "$AUTOSP_PYTHON" - "$dir" > "$logs/imported.json" <<'EOF'
import json, os, sys
d = sys.argv[1]
out, ok = {}, True
for model in ("gemma2", "opt", "bloom", "deepseek_v3", "glm4_moe_tf5", "gpt_oss", "dbrx", "llama4",
              "longcat_flash", "ctrl", "llama_lora", "llama_dora", "llama_vera", "scalar_gain", "normalized_gpt"):
    cpu, gpu = ([json.loads(l)["loss"] for l in open(os.path.join(d, f"{model}.{b}.jsonl")) if l.strip()]
                for b in ("cpu", "cuda"))
    worst = max(abs(a - b) / max(abs(a), 1e-30) for a, b in zip(cpu, gpu))
    out[model] = {"cpu_losses": cpu, "cuda_losses": gpu, "worst_relative": worst}
    # f32 on both backends, the same graph: summation order only, train_cli's bound.
    ok = ok and len(cpu) == len(gpu) == 4 and worst < 1e-4
# LoRA's and DoRA's bf16 device step against the fp32 CPU run: train_bf16's first-run bound.
for model in ("llama_lora", "llama_dora"):
    bf16 = [json.loads(l)["loss"] for l in open(os.path.join(d, f"{model}.bf16.jsonl")) if l.strip()]
    worst = max(abs(a - b) / abs(a) for a, b in zip(out[model]["cpu_losses"], bf16))
    out[f"{model}_bf16"] = {"cuda_bf16_losses": bf16, "worst_relative": worst}
    ok = ok and len(bf16) == 4 and worst < 5e-2
print(json.dumps(out))
sys.exit(0 if ok else 1)
EOF
}
export -f imported
run_stage imported 150 bash -c imported
record imported "$STAGE_STATUS" "$STAGE_SECONDS" "$logs/imported.json"

# ---- sequence parallelism on one GPU: SP 2 and 4 ranks sharing the device --------------------
# NCCL refuses two ranks on one GPU, so the collectives are staged through host memory over MPI
# (make_device_groups picks it: more ranks than devices). Mistral's fixture (4 query heads, 1 KV
# head: fewer than SP, so repeated; a window of 8) on packed documents, 5 steps at SP 1, 2, 4,
# in f32 (the host-AdamW path) and bf16 (the device-resident step): SP 2 and 4 must give SP 1's
# losses.
sp_one_gpu() {
  set -euo pipefail  # exported functions run in a fresh bash: no inherited -e
  local dir="$logs/sp_one_gpu" model=tests/fixtures/hf_families/mistral
  rm -rf "$dir"
  mkdir -p "$dir"
  "$AUTOSP_PYTHON" - "$dir" <<'EOF'
import json, os, struct, random, sys
d = sys.argv[1]
rng = random.Random(7)
tokens = []
while len(tokens) < 4000:  # documents of 5..40 tokens, each ended by eos (2)
    tokens += [rng.randrange(3, 48) for _ in range(rng.randrange(5, 41))] + [2]
open(os.path.join(d, "tokens.bin"), "wb").write(struct.pack(f"<{len(tokens)}I", *tokens))
for mode in ("f32", "bf16"):
    for P in (1, 2, 4):
        c = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
             "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}},
             "data": {"pack": True, "eos_token_id": 2, "shuffle": False},
             "sequence_parallel_size": P, "compile": {"deepcompile": True, "passes": ["autosp"]}}
        if mode == "bf16":
            c["bf16"] = {"enabled": True}
        json.dump(c, open(os.path.join(d, f"{mode}_sp{P}.json"), "w"))
        if P == 2:  # the all-to-alls on the communication stream (compile.overlap)
            c["compile"]["overlap"] = True
            json.dump(c, open(os.path.join(d, f"{mode}_overlap_sp{P}.json"), "w"))
EOF
  local mode P
  for mode in f32 bf16; do
    for P in 1 2 4; do
      OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 \
        "${MPIRUN[@]}" -np "$P" --oversubscribe "$bin/autosp" train --backend cuda --config "$dir/${mode}_sp$P.json" \
        --model "$model" --data "$dir/tokens.bin" --seq-len 64 --steps 5 --metrics "$dir/${mode}_sp$P.jsonl"
    done
    # overlap: the same losses bit for bit, and the profile's share of the exchanges hidden
    AUTOSP_PROFILE=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 \
      "${MPIRUN[@]}" -np 2 --oversubscribe "$bin/autosp" train --backend cuda --config "$dir/${mode}_overlap_sp2.json" \
      --model "$model" --data "$dir/tokens.bin" --seq-len 64 --steps 5 --metrics "$dir/${mode}_overlap_sp2.jsonl" \
      > "$dir/${mode}_overlap_sp2.log" 2>&1 || { cat "$dir/${mode}_overlap_sp2.log"; return 1; }
    grep "overlapped collectives" "$dir/${mode}_overlap_sp2.log" | head -1 > "$dir/${mode}_overlap_sp2.profile" || true
  done
  "$AUTOSP_PYTHON" - "$dir" > "$logs/sp_one_gpu.json" <<'EOF'
import json, os, sys
d = sys.argv[1]
def losses(name):
    return [json.loads(l)["loss"] for l in open(os.path.join(d, name)) if l.strip()]
out, ok = {}, True
# f32: the same maths in another order (the sequence split, the all-to-alls, the gradient sums
# over the ranks): fp32 reordering, 1e-5 relative over 5 AdamW steps (issue 43). bf16: every
# activation rounded to 8 bits, and SP changes which sums round where; 2e-2 relative is the
# first run's bound, to be set from what this stage prints.
for mode, tol in (("f32", 1e-5), ("bf16", 2e-2)):
    ref = losses(f"{mode}_sp1.jsonl")
    out[mode] = {"sp1": ref}
    for P in (2, 4):
        got = losses(f"{mode}_sp{P}.jsonl")
        worst = max(abs(a - b) / abs(b) for a, b in zip(got, ref)) if len(got) == len(ref) == 5 else float("inf")
        out[mode][f"sp{P}"] = got
        out[mode][f"sp{P}_worst_relative"] = worst
        ok = ok and worst < tol
    # compile.overlap moves the exchanges to another stream, never a number (issue 43)
    overlapped = losses(f"{mode}_overlap_sp2.jsonl")
    out[mode]["overlap_sp2"] = overlapped
    out[mode]["overlap_sp2_bitwise"] = overlapped == out[mode]["sp2"]
    out[mode]["overlap_profile"] = open(os.path.join(d, f"{mode}_overlap_sp2.profile")).read().strip()
    ok = ok and overlapped == out[mode]["sp2"]
print(json.dumps(out))
sys.exit(0 if ok else 1)
EOF
}
# mpirun: the machine's, or the Open MPI that gpu_bundle.sh packed (relocated with OPAL_PREFIX).
if command -v mpirun > /dev/null; then
  MPIRUN=(mpirun)
elif [ -n "$bundle" ] && [ -x "$bundle/ompi/bin/mpirun" ]; then
  export OPAL_PREFIX="$bundle/ompi"
  export PATH="$bundle/ompi/bin:$PATH"
  MPIRUN=("$bundle/ompi/bin/mpirun")
else
  MPIRUN=(false)  # the stage fails, saying so in its log
  echo "gpu_check: no mpirun here nor in a bundle (scripts/gpu_bundle.sh packs Open MPI)" >&2
fi
export MPIRUN_STR="${MPIRUN[*]}"
sp_one_gpu_wrapper() { MPIRUN=($MPIRUN_STR); sp_one_gpu; }
export -f sp_one_gpu sp_one_gpu_wrapper
run_stage sp_one_gpu 150 bash -c sp_one_gpu_wrapper
record sp_one_gpu "$STAGE_STATUS" "$STAGE_SECONDS" "$logs/sp_one_gpu.json"

# ---- the benchmark against PyTorch ------------------------------------------------------------
model=bench/models/llama-3.2-1b
steps=5
[ "$quick" -eq 1 ] && steps=2
bench() {
  set -euo pipefail  # exported functions run in a fresh bash: no inherited -e
  local out="{" seq
  for seq in 4096 16384; do
    local n=$steps
    [ "$seq" = 16384 ] && n=$(( steps < 3 ? steps : 3 ))  # the time budget: 3 timed steps at 16K
    # --kernels (S 4096 only: a few seconds): the fused row kernels against the reference ones.
    AUTOSP_PROFILE=1 "$bin/bench_cuda" --model "$model" --seq-len "$seq" --steps "$n" --checkpoint none \
      $([ "$seq" = 4096 ] && echo --kernels) --out "$logs/bench_autosp_$seq.json"
    "$AUTOSP_PYTHON" bench/bench_cuda_torch.py --config "$model/config.json" --seq-len "$seq" --steps "$n" \
      --checkpoint none --out "$logs/bench_torch_$seq.json"
    out="$out\"$seq\": $("$AUTOSP_PYTHON" - "$logs/bench_autosp_$seq.json" "$logs/bench_torch_$seq.json" <<'EOF'
import json, sys
a, t = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
S = a["seq_len"]
print(json.dumps({
    "seq_len": S, "batch": a["batch"],
    "autosp": {k: a[k] for k in ("step_seconds", "allocated_bytes", "device_used_bytes", "mfu", "losses")},
    "torch": {k: t[k] for k in ("step_seconds", "peak_bytes", "mfu", "losses", "torch")},
    # > 1: autosp slower / uses more memory than torch
    "step_time_ratio": a["step_seconds"] / t["step_seconds"],
    "peak_memory_ratio": a["allocated_bytes"] / t["peak_bytes"],
    # issue 42's targets, reported here (the stage passes when both sides ran)
    "targets": {"step_time_ratio_at_most": {4096: 0.8, 16384: 0.95}.get(S),
                "mfu_at_least": 0.45 if S == 16384 else None},
    "profile": a.get("profile", []),
    "profile_table": a.get("profile_table", ""),
    "fused_kernels": a.get("kernels", []),
}))
EOF
),"
  done
  echo "${out%,}}" > "$logs/bench.json"
}
export -f bench
export model steps
run_stage bench 240 bash -c bench
record bench "$STAGE_STATUS" "$STAGE_SECONDS" "$logs/bench.json"

# ---- the longest sequence per checkpoint policy ------------------------------------------------
max_seq() {
  set -uo pipefail
  # Every policy is tried; one that fails leaves the others' results and fails the stage.
  local out="{" failed=0 f
  for policy in none full sac; do
    f="$logs/maxseq_autosp_$policy.json"
    "$bin/bench_cuda" --model "$model" --seq-len 4096 --checkpoint "$policy" --max-seq --max-seq-limit 262144 \
      --time-box 30 --out "$f" || failed=1
    [ -s "$f" ] && out="$out\"autosp_$policy\": $(cat "$f"),"
  done
  for policy in none full; do
    f="$logs/maxseq_torch_$policy.json"
    "$AUTOSP_PYTHON" bench/bench_cuda_torch.py --config "$model/config.json" --seq-len 4096 --checkpoint "$policy" \
      --max-seq --out "$f" || failed=1
    [ -s "$f" ] && out="$out\"torch_$policy\": $(cat "$f"),"
  done
  echo "${out%,}}" > "$logs/max_seq.json"
  [ "$failed" -eq 0 ]
}
export -f max_seq
run_stage max_seq 240 bash -c max_seq
record max_seq "$STAGE_STATUS" "$STAGE_SECONDS" "$logs/max_seq.json"

write_result "$overall"
echo "gpu_check: $overall; results in $result"
[ "$overall" = "passed" ]
