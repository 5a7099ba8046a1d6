#!/usr/bin/env bash
# Memory of loading a sharded bf16 model (issue 21): a Llama of 560M parameters (1.12 GB in
# bf16) in 8 shards (and, as the baseline, in one file), trained one step on 2 ranks at ZeRO-3, each rank reading only the
# ranges it keeps. Prints each rank's resident peak (VmHWM, as the OS counts it) while
# reading and over the run, against the run's memory plan (the metrics' planned_peak_bytes),
# and the save of the same model (8 shards, bf16 weights + fp32 masters) with its time.
# Usage: bench/sharded_load_memory.sh BUILD_DIR [WORK_DIR]   (~4 GB of disk, ~10 GB of memory)
set -euo pipefail
build=${1:?usage: $0 BUILD_DIR [WORK_DIR]}
work=${2:-$(mktemp -d /tmp/autosp_sharded_mem.XXXXXX)}
autosp="$build/autosp"
mpi=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 mpirun -np 2 --oversubscribe)
mkdir -p "$work/init"
cat >"$work/init/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 100000, "hidden_size": 2048,
 "intermediate_size": 5632, "num_hidden_layers": 3, "num_attention_heads": 16, "num_key_value_heads": 4,
 "head_dim": 128, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": false,
 "max_position_embeddings": 2048, "hidden_act": "silu", "torch_dtype": "bfloat16"}
JSON
/usr/bin/python3 -c "
import struct, sys; open(sys.argv[1], 'wb').write(struct.pack('<%dI' % 4096, *[(i * 7919 + 13) % 100000 for i in range(4096)]))" \
  "$work/tokens.bin"
for shard in 50MB 50GB; do
  echo "== max_shard_size $shard"
  cat >"$work/ds_$shard.json" <<JSON
{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "steps_per_print": 1,
 "zero_optimization": {"stage": 3}, "checkpoint": {"max_shard_size": "$shard"}}
JSON
  # The model directory: the seeded init saved in bf16 (a save of 0 steps).
  model="$work/model_$shard"
  if [ ! -f "$model/config.json" ]; then
    "${mpi[@]}" "$autosp" train --config "$work/ds_$shard.json" --model "$work/init" --data "$work/tokens.bin" \
      --seq-len 64 --steps 0 --save "$work/ck0" --overwrite >"$work/init.log" 2>&1
    mkdir -p "$model"
    cp "$work/ck0/config.json" "$work/ck0"/model*.safetensors* "$model/"
  fi
  echo "weight files: $(ls "$model" | grep -c 'safetensors$'), $(du -sh "$model" | cut -f1)"
  "${mpi[@]}" "$autosp" train --config "$work/ds_$shard.json" --model "$model" --data "$work/tokens.bin" \
    --seq-len 64 --steps 1 --save "$work/ck1" --metrics "$work/m.jsonl" --overwrite 2>&1 | tee "$work/run.log" |
    grep -E "resident peak|saved|loaded"
  /usr/bin/python3 - "$work/m.jsonl" <<'PY'
import json, sys
m = json.loads(open(sys.argv[1]).read().splitlines()[-1])
plan = m["planned_peak_bytes"]
for r, (peak, base) in enumerate(zip(m["rss_peak_bytes_per_rank"], m["rss_base_bytes_per_rank"])):
    print("rank %d: resident peak above the start %.1f MiB, planned %.1f MiB: %.3f x plan"
          % (r, (peak - base) / 2**20, plan / 2**20, (peak - base) / plan))
PY
  rm -rf "$work/ck0" "$work/ck1"
done
echo "work dir: $work"
