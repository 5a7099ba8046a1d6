#!/usr/bin/env bash
# cli_errors.sh AUTOSP_BINARY: every broken input the CLI can be handed is a user error.
#
# Builds one valid setup with tests/reference/llama_reference.py, checks that it trains,
# then breaks one thing at a time (safetensors file, model config.json, DeepSpeed config,
# token file, command line) and asserts that autosp exits with exactly 1 (never 0, never a
# crash, never a hang: each run is under `timeout`), prints `autosp: error:` on stderr, and
# names what is wrong (the file, key, tensor or byte offset). Run by ctest against the
# normal build and by `make test` against the ASan+UBSan build, where ASAN_OPTIONS /
# UBSAN_OPTIONS set exitcode=86 / 87 so a sanitizer report shows up as a wrong exit code.
#
# CLI_ERRORS_VERBOSE=1 prints every case's stderr (to write or review expected substrings).
set -u

if [ $# -ne 1 ]; then
  echo "usage: $0 AUTOSP_BINARY" >&2
  exit 2
fi
AUTOSP=$(realpath -- "$1") || exit 2
if [ ! -x "$AUTOSP" ]; then
  echo "$0: $1 is not an executable" >&2
  exit 2
fi
ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=/usr/bin/python3
# Generous: a sanitized debug build trains the tiny model's one step in well under this.
TIMEOUT_S=60

TMP=$(mktemp -d "${TMPDIR:-/tmp}/autosp_cli_errors.XXXXXX") || exit 2
trap 'rm -rf -- "$TMP"' EXIT

VALID=$TMP/valid
if ! "$PYTHON" "$ROOT/tests/reference/llama_reference.py" --out "$VALID" >"$TMP/reference.log" 2>&1; then
  echo "FAIL setup: llama_reference.py --out $VALID failed:" >&2
  cat "$TMP/reference.log" >&2
  exit 1
fi
rm -f "$VALID/expected.safetensors"  # the reference's gradients; not an input

# Edits a copy of the valid setup. One subcommand per kind of damage.
MUTATE=$TMP/mutate.py
cat >"$MUTATE" <<'EOF'
import json, os, struct, sys

def read_st(path):
    b = open(path, "rb").read()
    (n,) = struct.unpack("<Q", b[:8])
    return json.loads(b[8 : 8 + n]), b[8 + n :]

def write_st(path, header, data):
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    open(path, "wb").write(struct.pack("<Q", len(text)) + text + data)

def tensors(path):
    """(header metadata, [(name, entry, bytes)]) in data order."""
    header, data = read_st(path)
    meta = header.pop("__metadata__", None)
    items = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    return meta, [(k, v, data[v["data_offsets"][0] : v["data_offsets"][1]]) for k, v in items]

def relayout(path, meta, items):
    """Writes a well-formed file: offsets tile the buffer exactly."""
    header = {} if meta is None else {"__metadata__": meta}
    data = b""
    for name, entry, raw in items:
        entry = dict(entry, data_offsets=[len(data), len(data) + len(raw)])
        header[name] = entry
        data += raw
    write_st(path, header, data)

def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n

op, path, args = sys.argv[1], sys.argv[2], sys.argv[3:]
if op == "truncate":  # truncate FILE N|mid-header|mid-data
    b = open(path, "rb").read()
    (n,) = struct.unpack("<Q", b[:8])
    at = {"mid-header": 8 + n // 2, "mid-data": (8 + n + len(b)) // 2}.get(args[0])
    open(path, "wb").write(b[: int(args[0]) if at is None else at])
elif op == "header-len":  # header-len FILE N|file-size: overwrites the length field only
    b = open(path, "rb").read()
    n = len(b) if args[0] == "file-size" else int(args[0])
    open(path, "wb").write(struct.pack("<Q", n) + b[8:])
elif op == "raw-header":  # raw-header FILE TEXT: replaces the header, keeps the data
    _, data = read_st(path)
    text = args[0].encode()
    open(path, "wb").write(struct.pack("<Q", len(text)) + text + data)
elif op == "offsets":  # offsets FILE TENSOR BEGIN END: header edit only
    header, data = read_st(path)
    begin, end = (len(data) + int(a[4:]) if a.startswith("end+") else int(a) for a in args[1:3])
    header[args[0]]["data_offsets"] = [begin, end]
    write_st(path, header, data)
elif op == "shape":  # shape FILE TENSOR D0,D1,..: consistent byte size, offsets relaid
    meta, items = tensors(path)
    shape = [int(d) for d in args[1].split(",")]
    items = [(k, dict(v, shape=shape), raw[: 4 * numel(shape)]) if k == args[0] else (k, v, raw)
             for k, v, raw in items]
    relayout(path, meta, items)
elif op == "dtype":  # dtype FILE TENSOR DTYPE ITEMSIZE
    meta, items = tensors(path)
    items = [(k, dict(v, dtype=args[1]), bytes(int(args[2]) * numel(v["shape"]))) if k == args[0]
             else (k, v, raw) for k, v, raw in items]
    relayout(path, meta, items)
elif op == "drop":  # drop FILE TENSOR
    meta, items = tensors(path)
    assert any(k == args[0] for k, _, _ in items), args[0]
    relayout(path, meta, [it for it in items if it[0] != args[0]])
elif op == "remanifest":  # remanifest DIR: a checkpoint's manifest.json vouching for its files as they are now
    def fnv1a64(data):
        h = 0xCBF29CE484222325
        for b in data:
            h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
        return "%016x" % h
    m = json.load(open(os.path.join(path, "manifest.json")))
    for rel in m["files"]:
        data = open(os.path.join(path, rel), "rb").read()
        m["files"][rel] = {"bytes": len(data), "fnv1a64": fnv1a64(data)}
    json.dump(m, open(os.path.join(path, "manifest.json"), "w"), indent=2)
elif op == "json":  # json FILE CODE: runs CODE with the parsed file as `c`
    c = json.load(open(path))
    exec(args[0])
    json.dump(c, open(path, "w"), indent=2)
elif op == "token":  # token FILE INDEX VALUE
    b = bytearray(open(path, "rb").read())
    b[4 * int(args[0]) : 4 * int(args[0]) + 4] = struct.pack("<I", int(args[1]))
    open(path, "wb").write(bytes(b))
elif op == "idx":  # idx FILE FIELD VALUE: sets a field of a Megatron .idx (FIELD: magic, version,
    # dtype, seqcount, doccount, length[i], pointer[i], doc[j]), the offsets from its own counts
    b = bytearray(open(path, "rb").read())
    (n,) = struct.unpack_from("<Q", b, 18)
    field, value = args[0], args[1]
    name, _, index = field.rstrip("]").partition("[")
    at, fmt = {"magic": (0, "9s"), "version": (9, "<Q"), "dtype": (17, "<B"), "seqcount": (18, "<Q"),
               "doccount": (26, "<Q"), "length": (34, "<i"), "pointer": (34 + 4 * n, "<q"),
               "doc": (34 + 12 * n, "<q")}[name]
    at += int(index or 0) * struct.calcsize(fmt)
    struct.pack_into(fmt, b, at, value.encode() if fmt == "9s" else int(value, 0))
    open(path, "wb").write(bytes(b))
elif op == "indexed":  # indexed TOKENS PREFIX DOC_LEN: the token file as an indexed dataset of
    # DOC_LEN-token documents, written by scripts/make_indexed_dataset.py
    import subprocess
    ids = list(struct.unpack("<%dI" % (len(open(path, "rb").read()) // 4), open(path, "rb").read()))
    doc = int(args[1])
    with open(args[0] + ".jsonl", "w") as f:
        for i in range(0, len(ids), doc):
            f.write(json.dumps(ids[i : i + doc]) + "\n")
    subprocess.run([sys.executable, args[2], "--jsonl", args[0] + ".jsonl", "--vocab-size", "67",
                    "--output-prefix", args[0]], check=True, stdout=subprocess.DEVNULL)
elif op in ("shard-drop", "shard-dup", "unmap"):  # OP DIR TENSOR: a sharded model's index and shards
    import os
    index_path = os.path.join(path, "model.safetensors.index.json")
    index = json.load(open(index_path))
    shard = os.path.join(path, index["weight_map"][args[0]])
    if op == "unmap":  # the index forgets a tensor its shard holds
        del index["weight_map"][args[0]]
        json.dump(index, open(index_path, "w"), indent=2)
    elif op == "shard-drop":  # the shard loses a tensor the index maps to it
        meta, items = tensors(shard)
        relayout(shard, meta, [it for it in items if it[0] != args[0]])
    else:  # the tensor also in another shard (the first one that lacks it)
        meta, items = tensors(shard)
        tensor = [it for it in items if it[0] == args[0]]
        other = sorted(f for f in set(index["weight_map"].values()) if os.path.join(path, f) != shard)[0]
        meta2, items2 = tensors(os.path.join(path, other))
        relayout(os.path.join(path, other), meta2, items2 + tensor)
elif op == "add-tensor":  # add-tensor FILE NAME N: an F32 tensor of N ones, appended
    meta, items = tensors(path)
    relayout(path, meta, items + [(args[0], {"dtype": "F32", "shape": [int(args[1])]},
                                   struct.pack("<%df" % int(args[1]), *([1.0] * int(args[1]))))])
elif op == "retoken":  # retoken FILE VOCAB: every token id modulo VOCAB
    b = open(path, "rb").read()
    ids = struct.unpack("<%dI" % (len(b) // 4), b)
    open(path, "wb").write(struct.pack("<%dI" % len(ids), *(i % int(args[0]) for i in ids)))
else:
    sys.exit("mutate.py: unknown op " + op)
EOF

declare -a FAILED=()
NUM_CASES=0

# A fresh copy of the valid setup for case $1, in $CASE. Failing to build a case fails it,
# so a case whose setup broke is never silently skipped.
new_case() {
  CASE=$TMP/cases/$1
  if ! mkdir -p "$TMP/cases" || ! cp -r "$VALID" "$CASE"; then
    echo "FAIL $1: cannot copy the valid setup"
    FAILED+=("$1")
    return 1
  fi
}

mutate() {
  if ! "$PYTHON" "$MUTATE" "$@" 2>"$TMP/mutate.err"; then
    echo "FAIL ${CASE##*/}: mutate.py $* failed: $(cat "$TMP/mutate.err")"
    FAILED+=("${CASE##*/}")
    return 1
  fi
}

# run_expect NAME WANT_RC NEEDLE... -- COMMAND...: runs COMMAND, asserts its exit code is
# WANT_RC and that stderr contains every NEEDLE (fixed strings).
run_expect() {
  local name=$1 want_rc=$2
  shift 2
  local -a needles=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    needles+=("$1")
    shift
  done
  shift
  NUM_CASES=$((NUM_CASES + 1))
  local out=$TMP/$name.stdout err=$TMP/$name.stderr rc why=""
  timeout "$TIMEOUT_S" "$@" >"$out" 2>"$err" </dev/null
  rc=$?
  if [ "$rc" -eq 124 ]; then
    why="hung: killed after ${TIMEOUT_S}s"
  elif [ "$rc" -eq 86 ] || [ "$rc" -eq 87 ]; then
    why="sanitizer report (exit $rc)"
  elif [ "$rc" -gt 128 ]; then
    why="killed by signal $((rc - 128)) (exit $rc)"
  elif [ "$rc" -ne "$want_rc" ]; then
    why="exit $rc, want $want_rc"
  elif grep -qE 'Sanitizer|runtime error:' "$err"; then
    why="sanitizer output on stderr"
  else
    local n
    for n in "${needles[@]}"; do
      if ! grep -qF -- "$n" "$err"; then
        why="${why:+$why; }stderr lacks '$n'"
      fi
    done
  fi
  if [ -z "$why" ]; then
    echo "PASS $name"
  else
    echo "FAIL $name: $why"
    echo "  command: $*"
    sed -n '1,15s/^/  stderr: /p' "$err"
    [ -s "$err" ] || tail -n 3 "$out" | sed 's/^/  stdout: /'
    FAILED+=("$name")
  fi
  if [ "${CLI_ERRORS_VERBOSE:-0}" = 1 ] && [ -z "$why" ]; then
    sed 's/^/  stderr: /' "$err"
  fi
}

# expect_stdout NAME TEXT: the stdout of case NAME (a run that succeeded) has the line part TEXT.
expect_stdout() {
  if ! grep -qF -- "$2" "$TMP/$1.stdout" 2>/dev/null; then
    echo "FAIL $1: no '$2' on stdout"
    FAILED+=("$1_stdout")
  fi
}

# expect_error NAME NEEDLE... -- COMMAND...: a user error naming NEEDLE.
expect_error() {
  local name=$1
  shift
  run_expect "$name" 1 "autosp: error:" "$@"
}

# train_case NAME NEEDLE...: trains the case's setup ($CASE) one step, expecting an error.
train_case() {
  local name=$1
  shift
  expect_error "$name" "$@" -- "$AUTOSP" train --config "$CASE/ds_config.json" --model "$CASE" \
    --data "$CASE/tokens.bin" --seq-len 16 --steps 1
}

# ---------------------------------------------------------------------------- sanity
# The valid setup trains, so every error below comes from the one thing each case breaks.
# Its checkpoint is the valid input the --resume cases break.
new_case sanity
CHECKPOINT=$TMP/checkpoint
run_expect sanity_valid_setup_trains 0 -- "$AUTOSP" train --config "$CASE/ds_config.json" \
  --model "$CASE" --data "$CASE/tokens.bin" --seq-len 16 --steps 1 --save "$CHECKPOINT" \
  --metrics "$TMP/sanity_metrics.jsonl"
if ! grep -Eq "^step 1/1 \| loss [0-9.]+ \| lr [0-9.e+-]+ \| grad norm [0-9.]+ \| [1-9][0-9]* tok/s \| peak .* elapsed, ETA " \
  "$TMP/sanity_valid_setup_trains.stdout"; then
  echo "FAIL sanity_valid_setup_trains: no 'step 1/1 | loss ... | N tok/s | peak ...' line on stdout"
  FAILED+=(sanity_valid_setup_trains_stdout)
fi
# The metrics keep the step's tok/s and give the step line's windowed one beside it (over one
# step here, so the same up to rounding).
if ! "$PYTHON" -c 'import json, sys; m = json.loads(open(sys.argv[1]).readline())
assert m["tokens_per_s"] > 0 and abs(m["tokens_per_s_window"] / m["tokens_per_s"] - 1) < 1e-9, m' \
  "$TMP/sanity_metrics.jsonl" >"$TMP/sanity_metrics.log" 2>&1; then
  echo "FAIL sanity_valid_setup_trains: metrics tokens_per_s / tokens_per_s_window: $(cat "$TMP/sanity_metrics.log")"
  FAILED+=(sanity_metrics_tokens_per_s)
fi
# The start-up log says what optimizes, defaults included (the setup gives every AdamW param).
for line in "optimizer: AdamW lr 0.01 betas (0.9, 0.95) eps 1e-8 weight_decay 0.1" \
  "scheduler: WarmupLR: linear warmup from 0 to 0.01 over 3 steps, then constant"; do
  grep -qxF -- "$line" "$TMP/sanity_valid_setup_trains.stdout" ||
    { echo "FAIL sanity_valid_setup_trains: no '$line' on stdout"; FAILED+=(sanity_optimizer_line); }
done

# ---------------------------------------------------------------------------- torch programs
# --model a file that is not a .pt2 program; a .pt2 that is not an archive; an op autosp lacks.
new_case model_is_a_plain_file
expect_error model_is_a_plain_file "neither a model directory" "tokens.bin" -- "$AUTOSP" train --config "$CASE/ds_config.json" \
  --model "$CASE/tokens.bin" --data "$CASE/tokens.bin" --seq-len 16 --steps 1
new_case pt2_not_an_archive && cp "$CASE/tokens.bin" "$CASE/model.pt2"
expect_error pt2_not_an_archive "not a readable zip archive" -- "$AUTOSP" train --config "$CASE/ds_config.json" \
  --model "$CASE/model.pt2" --data "$CASE/tokens.bin" --seq-len 16 --steps 1
new_case pt2_unsupported_op
expect_error pt2_unsupported_op "node 'softplus'" "F.softplus" -- "$AUTOSP" train --config "$CASE/ds_config.json" \
  --model "$ROOT/tests/fixtures/torch_export_errors/softplus/model.pt2" --data "$CASE/tokens.bin" --seq-len 16 --steps 1

# ---------------------------------------------------------------------------- safetensors
for len in 0 4 8 mid-header mid-data; do
  name=st_truncated_$len
  new_case "$name" && mutate truncate "$CASE/model.safetensors" "$len" || continue
  case $len in
    0 | 4) want="file is $len bytes, too short" ;;
    8 | mid-header) want="exceeds the" ;;  # the header length points past the end
    mid-data) want="ends beyond the" ;;     # a tensor's data_offsets do
  esac
  train_case "$name" "$CASE/model.safetensors" "$want"
done

new_case st_header_len_past_eof && mutate header-len "$CASE/model.safetensors" file-size &&
  train_case st_header_len_past_eof "$CASE/model.safetensors" "header length" "(file truncated?)"

# 2^64 - 1: must not wrap around when added to the 8-byte length field.
new_case st_header_len_max && mutate header-len "$CASE/model.safetensors" 18446744073709551615 &&
  train_case st_header_len_max "$CASE/model.safetensors" "header length 18446744073709551615"

new_case st_header_len_0 && mutate header-len "$CASE/model.safetensors" 0 &&
  train_case st_header_len_0 "$CASE/model.safetensors" "header length 0"

new_case st_header_not_json && mutate raw-header "$CASE/model.safetensors" '{"model.norm.weight": [' &&
  train_case st_header_not_json "$CASE/model.safetensors" "header is not valid JSON"

new_case st_header_not_object && mutate raw-header "$CASE/model.safetensors" 'not a safetensors header' &&
  train_case st_header_not_object "$CASE/model.safetensors" "header does not start with '{'"

new_case st_data_offsets_past_end &&
  mutate offsets "$CASE/model.safetensors" model.norm.weight end+0 end+128 &&
  train_case st_data_offsets_past_end "$CASE/model.safetensors" "tensor 'model.norm.weight'" \
    "data_offsets" "ends beyond the"

new_case st_data_offsets_reversed &&
  mutate offsets "$CASE/model.safetensors" model.norm.weight 128 0 &&
  train_case st_data_offsets_reversed "$CASE/model.safetensors" "tensor 'model.norm.weight'" \
    "begin after end"

new_case st_wrong_shape && mutate shape "$CASE/model.safetensors" model.norm.weight 31 &&
  train_case st_wrong_shape "$CASE/model.safetensors" "tensor 'model.norm.weight'" "[31]" "[32]"

new_case st_missing_tensor && mutate drop "$CASE/model.safetensors" model.layers.1.mlp.down_proj.weight &&
  train_case st_missing_tensor "$CASE/model.safetensors" "missing tensor 'model.layers.1.mlp.down_proj.weight'"

new_case st_dtype_i64 && mutate dtype "$CASE/model.safetensors" model.norm.weight I64 8 &&
  train_case st_dtype_i64 "$CASE/model.safetensors" "tensor 'model.norm.weight'" '"I64"'

new_case st_tied_config_with_lm_head &&
  mutate json "$CASE/config.json" 'c["tie_word_embeddings"] = True' &&
  train_case st_tied_config_with_lm_head "$CASE/model.safetensors" "lm_head.weight" "tie_word_embeddings"

# ---------------------------------------------------------------------------- config.json
new_case model_config_not_json && printf '{"vocab_size": 67,' >"$CASE/config.json" &&
  train_case model_config_not_json "$CASE/config.json" "JSON"

new_case model_vocab_size_string && mutate json "$CASE/config.json" 'c["vocab_size"] = "67"' &&
  train_case model_vocab_size_string "$CASE/config.json" "vocab_size"

new_case model_attention_bias && mutate json "$CASE/config.json" 'c["attention_bias"] = True' &&
  train_case model_attention_bias "$CASE/config.json" "attention_bias"

new_case model_rope_longrope && mutate json "$CASE/config.json" 'c["rope_scaling"]["rope_type"] = "longrope"' &&
  train_case model_rope_longrope "$CASE/config.json" "rope_type" "longrope" "is not supported"

new_case model_architecture_gemma &&
  mutate json "$CASE/config.json" 'c["architectures"] = ["GemmaForCausalLM"]' &&
  train_case model_architecture_gemma "$CASE/config.json" "GemmaForCausalLM" "is not supported"

new_case model_type_mismatch &&
  mutate json "$CASE/config.json" 'c["architectures"] = ["MistralForCausalLM"]' &&
  train_case model_type_mismatch "$CASE/config.json" "model_type" "MistralForCausalLM" "mistral"

# Qwen2's window (layers from max_window_layers on) is not implemented: refused by key.
new_case model_qwen2_use_sliding_window &&
  mutate json "$CASE/config.json" 'c["architectures"] = ["Qwen2ForCausalLM"]; c["model_type"] = "qwen2"; c.pop("attention_bias", None); c.pop("mlp_bias", None); c["use_sliding_window"] = True; c["sliding_window"] = 8' &&
  train_case model_qwen2_use_sliding_window "$CASE/config.json" "use_sliding_window" "Qwen2ForCausalLM"

new_case model_kv_heads_not_dividing && mutate json "$CASE/config.json" 'c["num_key_value_heads"] = 3' &&
  train_case model_kv_heads_not_dividing "$CASE/config.json" "num_key_value_heads" "num_attention_heads"

# 2^62 x hidden 32 overflows int64: without weights to compare against (random init) the
# size must still be rejected, not wrapped into a small model.
new_case model_intermediate_size_overflow && rm "$CASE/model.safetensors" &&
  mutate json "$CASE/config.json" 'c["intermediate_size"] = 2**62' &&
  train_case model_intermediate_size_overflow "$CASE/config.json" "intermediate_size"

# ---------------------------------------------------------------------------- ds_config.json
new_case ds_train_batch_size_inconsistent && mutate json "$CASE/ds_config.json" 'c["train_batch_size"] = 6' &&
  train_case ds_train_batch_size_inconsistent "$CASE/ds_config.json" "train_batch_size"

new_case ds_optimizer_sgd && mutate json "$CASE/ds_config.json" 'c["optimizer"]["type"] = "SGD"' &&
  train_case ds_optimizer_sgd "$CASE/ds_config.json" "optimizer.type" "SGD"

new_case ds_lr_negative && mutate json "$CASE/ds_config.json" 'c["optimizer"]["params"]["lr"] = -0.01' &&
  train_case ds_lr_negative "$CASE/ds_config.json" "optimizer.params.lr"

new_case ds_lr_string && mutate json "$CASE/ds_config.json" 'c["optimizer"]["params"]["lr"] = "0.01"' &&
  train_case ds_lr_string "$CASE/ds_config.json" "optimizer.params.lr"

new_case ds_zero_stage_5 && mutate json "$CASE/ds_config.json" 'c["zero_optimization"] = {"stage": 5}' &&
  train_case ds_zero_stage_5 "$CASE/ds_config.json" "zero_optimization.stage" "0, 1, 2 or 3"

new_case ds_zero3_offload_param_cpu &&
  mutate json "$CASE/ds_config.json" 'c["zero_optimization"] = {"stage": 3, "offload_param": {"device": "cpu", "pin_memory": True}}' &&
  train_case ds_zero3_offload_param_cpu "$CASE/ds_config.json" "zero_optimization.offload_param.device" "CPU backend"

new_case ds_offload_optimizer_cpu &&
  mutate json "$CASE/ds_config.json" 'c["zero_optimization"] = {"stage": 1, "offload_optimizer": {"device": "cpu"}}' &&
  train_case ds_offload_optimizer_cpu "$CASE/ds_config.json" "zero_optimization.offload_optimizer.device" \
    "nothing to offload"

new_case ds_offload_param_cpu &&
  mutate json "$CASE/ds_config.json" 'c["zero_optimization"] = {"stage": 1, "offload_param": {"device": "cpu"}}' &&
  train_case ds_offload_param_cpu "$CASE/ds_config.json" "zero_optimization.offload_param.device"

new_case ds_reduce_bucket_size_0 &&
  mutate json "$CASE/ds_config.json" 'c["zero_optimization"] = {"stage": 1, "reduce_bucket_size": 0}' &&
  train_case ds_reduce_bucket_size_0 "$CASE/ds_config.json" "zero_optimization.reduce_bucket_size"

new_case ds_auto_total_num_steps &&
  mutate json "$CASE/ds_config.json" 'c["scheduler"] = {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto"}}' &&
  train_case ds_auto_total_num_steps "$CASE/ds_config.json" "scheduler.params.total_num_steps" '"auto"'

# ZeRO stages 2 and 3 in one process train (and, in make test, run under the sanitizers:
# the grad_sync pass's buckets and gathers, the sharded optimizer, a checkpoint gather).
for stage in 2 3; do
  new_case "ds_zero${stage}_trains" &&
    mutate json "$CASE/ds_config.json" "c['zero_optimization'] = {'stage': $stage, 'reduce_bucket_size': 3000}" &&
    run_expect "ds_zero${stage}_trains" 0 -- "$AUTOSP" train --config "$CASE/ds_config.json" --model "$CASE" \
      --data "$CASE/tokens.bin" --seq-len 16 --steps 2 --save "$TMP/zero${stage}_ckpt"
done

# "auto" as Hugging Face resolves it, printed: the batch from the micro batch and accumulation.
new_case ds_auto_batch_and_clipping &&
  mutate json "$CASE/ds_config.json" 'c["train_batch_size"] = "auto"; c["gradient_clipping"] = "auto"' &&
  run_expect ds_auto_batch_and_clipping 0 'train_batch_size: "auto" -> 4' 'gradient_clipping: "auto" -> 1.0' -- \
    "$AUTOSP" train --config "$CASE/ds_config.json" --model "$CASE" --data "$CASE/tokens.bin" --seq-len 16 --steps 1

# Without train_batch_size, so the only thing wrong is the accumulation count itself.
new_case ds_grad_accum_0 &&
  mutate json "$CASE/ds_config.json" 'c["gradient_accumulation_steps"] = 0; del c["train_batch_size"]' &&
  train_case ds_grad_accum_0 "$CASE/ds_config.json" "gradient_accumulation_steps"

# A typo of a known key would train on its default: an error naming the key meant.
new_case ds_typo_key && mutate json "$CASE/ds_config.json" \
  'del c["gradient_accumulation_steps"]; del c["train_batch_size"]; c["gradient_acumulation_steps"] = 2' &&
  train_case ds_typo_key "$CASE/ds_config.json: gradient_acumulation_steps: unknown key" \
    'did you mean "gradient_accumulation_steps"?'

# Without optimizer and scheduler sections the defaults train, and the log says which.
new_case ds_defaults_said && mutate json "$CASE/ds_config.json" \
  'del c["optimizer"]; del c["scheduler"]; c["activation_checkpointing"] = {"partition_activations": True}' &&
  run_expect ds_defaults_said 0 "activation_checkpointing: ignored" "compile.checkpoint" 'this run uses "none"' -- \
    "$AUTOSP" train --config "$CASE/ds_config.json" --model "$CASE" --data "$CASE/tokens.bin" --seq-len 16 --steps 1 &&
  expect_stdout ds_defaults_said \
    "optimizer: AdamW lr 0.001 betas (0.9, 0.999) eps 1e-8 weight_decay 0.01 (defaults: no optimizer section)" &&
  expect_stdout ds_defaults_said "scheduler: constant lr 0.001 (no scheduler section)"

new_case ds_unknown_key_warns && mutate json "$CASE/ds_config.json" 'c["no_such_deepspeed_key"] = 1' &&
  run_expect ds_unknown_key_warns 0 "warning" "no_such_deepspeed_key" -- "$AUTOSP" train \
    --config "$CASE/ds_config.json" --model "$CASE" --data "$CASE/tokens.bin" --seq-len 16 --steps 1

# ---------------------------------------------------------------------------- token file
# Token 5 is in the first sample, which step 1 reads: byte offset 5 * 4 = 20.
new_case data_token_out_of_range && mutate token "$CASE/tokens.bin" 5 67 &&
  train_case data_token_out_of_range "$CASE/tokens.bin" "token id 67" "byte offset 20" "vocab_size 67"
# The file's last token, which a 1-step run never reads: found at start-up all the same
# (every id of --data is checked before training), not at the step that reaches it.
new_case data_last_token_out_of_range &&
  last=$(( $(stat -c %s "$CASE/tokens.bin") / 4 - 1 )) && mutate token "$CASE/tokens.bin" "$last" 300 &&
  train_case data_last_token_out_of_range "$CASE/tokens.bin" "token id 300" "byte offset $(( last * 4 ))" \
    "vocab_size 67" "checked at start-up"

# 16 tokens: one sample of S = 16 needs 17.
new_case data_shorter_than_one_sample && head -c 64 "$VALID/tokens.bin" >"$CASE/tokens.bin" &&
  train_case data_shorter_than_one_sample "$CASE/tokens.bin" "16 tokens" "S=16"

new_case data_size_not_multiple_of_4 && truncate -s 837 "$CASE/tokens.bin" &&
  train_case data_size_not_multiple_of_4 "$CASE/tokens.bin" "not a multiple of 4"

new_case data_missing_file &&
  expect_error data_missing_file "$CASE/no_such_tokens.bin" -- "$AUTOSP" train \
    --config "$CASE/ds_config.json" --model "$CASE" --data "$CASE/no_such_tokens.bin" --seq-len 16 --steps 1

# ---------------------------------------------------------------------------- indexed dataset
# The valid setup's tokens as a Megatron indexed dataset ($CASE/ds.bin + ds.idx, uint16 ids,
# 17 documents of 13 tokens but the last: 17 sequences), packed by default.
indexed_case() {
  new_case "$1" && mutate indexed "$CASE/tokens.bin" "$CASE/ds" 13 "$ROOT/scripts/make_indexed_dataset.py"
}
# idx_case NAME NEEDLE...: trains on $CASE/ds one step, expecting an error.
idx_case() {
  local name=$1
  shift
  expect_error "$name" "$@" -- "$AUTOSP" train --config "$CASE/ds_config.json" --model "$CASE" \
    --data "$CASE/ds" --seq-len 16 --steps 1
}
indexed_case data_indexed_trains &&
  run_expect data_indexed_trains 0 -- "$AUTOSP" train \
    --config "$CASE/ds_config.json" --model "$CASE" --data "$CASE/ds" --seq-len 16 --steps 1 &&
  run_expect data_indexed_as_idx_path 0 -- "$AUTOSP" train \
    --config "$CASE/ds_config.json" --model "$CASE" --data "$CASE/ds.idx" --seq-len 16 --steps 1
expect_stdout data_indexed_trains "Megatron indexed dataset of uint16 ids, 17 documents in 17 sequences, 209 tokens"
expect_stdout data_indexed_trains "step 1/1"
expect_stdout data_indexed_as_idx_path "step 1/1"
for len in 0 20 33 100 300; do
  indexed_case "idx_truncated_$len" && truncate -s "$len" "$CASE/ds.idx" &&
    idx_case "idx_truncated_$len" "$CASE/ds.idx" "truncated"
done
indexed_case idx_wrong_magic && mutate idx "$CASE/ds.idx" magic "NOTANIDX!" &&
  idx_case idx_wrong_magic "$CASE/ds.idx" 'magic is "NOTANIDX!"' "MMIDIDX"
indexed_case idx_wrong_version && mutate idx "$CASE/ds.idx" version 3 && idx_case idx_wrong_version "version 3"
indexed_case idx_float_dtype && mutate idx "$CASE/ds.idx" dtype 7 && idx_case idx_float_dtype "dtype code 7 (float32)"
indexed_case idx_unknown_dtype && mutate idx "$CASE/ds.idx" dtype 42 && idx_case idx_unknown_dtype "unknown dtype code 42"
indexed_case idx_seqcount_past_file && mutate idx "$CASE/ds.idx" seqcount 0x7fffffffffffffff &&
  idx_case idx_seqcount_past_file "$CASE/ds.idx" "sequence count 9223372036854775807" "corrupt count"
indexed_case idx_doccount_past_file && mutate idx "$CASE/ds.idx" doccount 1000 &&
  idx_case idx_doccount_past_file "$CASE/ds.idx" "document count 1000" "corrupt count"
indexed_case idx_pointer_out_of_range && mutate idx "$CASE/ds.idx" "pointer[3]" 1000000 &&
  idx_case idx_pointer_out_of_range "sequence_pointers[3] = 1000000 is outside" "$CASE/ds.bin"
indexed_case idx_pointer_inconsistent && mutate idx "$CASE/ds.idx" "pointer[3]" 2 &&
  idx_case idx_pointer_inconsistent "sequence_pointers[3] = 2" "sequence 2 ends at byte 78"
indexed_case idx_length_overflow && mutate idx "$CASE/ds.idx" "length[1]" 2147483647 &&
  idx_case idx_length_overflow "sequence_lengths[1] = 2147483647" "past the end of"
indexed_case idx_length_negative && mutate idx "$CASE/ds.idx" "length[0]" -1 &&
  idx_case idx_length_negative "sequence_lengths[0] = -1 is negative"
indexed_case idx_document_not_monotone && mutate idx "$CASE/ds.idx" "doc[2]" 0 &&
  idx_case idx_document_not_monotone "document_indices[2] = 0 is less than document_indices[1] = 1"
indexed_case idx_document_last && mutate idx "$CASE/ds.idx" "doc[17]" 16 &&
  idx_case idx_document_last "document_indices[17] = 16, expected the sequence count 17"
indexed_case idx_bin_truncated && truncate -s 100 "$CASE/ds.bin" &&
  idx_case idx_bin_truncated "$CASE/ds.idx" "past the end of $CASE/ds.bin (100 bytes)"
indexed_case idx_bin_missing && rm "$CASE/ds.bin" && idx_case idx_bin_missing "$CASE/ds.bin does not exist"
# Token 5 of the .bin (uint16: byte offset 10), in the first sample.
indexed_case idx_token_out_of_range && "$PYTHON" -c "
import sys; b = bytearray(open(sys.argv[1], 'rb').read()); b[10:12] = (67).to_bytes(2, 'little')
open(sys.argv[1], 'wb').write(bytes(b))" "$CASE/ds.bin" &&
  idx_case idx_token_out_of_range "$CASE/ds.bin" "token id 67" "byte offset 10" "vocab_size 67"
# Resume checks the data by both files: a checkpoint trained on the dataset resumes on it,
# and refuses the same dataset with one document boundary moved (an .idx of the same size).
indexed_case data_indexed_resume &&
  run_expect data_indexed_resume_save 0 -- "$AUTOSP" train --config "$CASE/ds_config.json" --model "$CASE" \
    --data "$CASE/ds" --seq-len 16 --steps 1 --save "$CASE/ckpt" &&
  run_expect data_indexed_resume_same 0 -- "$AUTOSP" train --config "$CASE/ds_config.json" \
    --resume "$CASE/ckpt" --data "$CASE/ds" --steps 2 &&
  mutate idx "$CASE/ds.idx" "doc[1]" 2 &&
  expect_error data_indexed_resume_other_documents "not the data the checkpoint" "--allow-new-data" -- \
    "$AUTOSP" train --config "$CASE/ds_config.json" --resume "$CASE/ckpt" --data "$CASE/ds" --steps 3
# The config's data section: refused values, and eos_token_id outside the vocabulary.
new_case data_eos_out_of_vocab && mutate json "$CASE/ds_config.json" 'c["data"] = {"eos_token_id": 67}' &&
  train_case data_eos_out_of_vocab "data.eos_token_id: 67" "vocab_size is 67"
new_case data_pack_flat_without_eos && mutate json "$CASE/ds_config.json" 'c["data"] = {"pack": True}' &&
  train_case data_pack_flat_without_eos "data.pack: true" "data.eos_token_id"
new_case data_eos_packs_a_flat_file && mutate json "$CASE/ds_config.json" 'c["data"] = {"eos_token_id": 3}' &&
  run_expect data_eos_packs_a_flat_file 0 -- "$AUTOSP" train \
    --config "$CASE/ds_config.json" --model "$CASE" --data "$CASE/tokens.bin" --seq-len 16 --steps 1 &&
  expect_stdout data_eos_packs_a_flat_file "documents (each ending at eos_token_id 3, packed)"

new_case data_shuffle_not_bool && mutate json "$CASE/ds_config.json" 'c["data"] = {"shuffle": "yes"}' &&
  train_case data_shuffle_not_bool "data.shuffle" "true or false"
new_case data_seed_negative && mutate json "$CASE/ds_config.json" 'c["data"] = {"seed": -3}' &&
  train_case data_seed_negative "data.seed" "an integer >= 0, got -3"
# The default order is shuffled, seeded by the top-level seed, and said at start-up.
new_case data_shuffled_by_default && mutate json "$CASE/ds_config.json" 'c["data"] = {}; c["seed"] = 8' &&
  run_expect data_shuffled_by_default 0 -- "$AUTOSP" train \
    --config "$CASE/ds_config.json" --model "$CASE" --data "$CASE/tokens.bin" --seq-len 16 --steps 1 &&
  expect_stdout data_shuffled_by_default "data order: shuffled (seed 8, a new permutation each epoch)"

# ---------------------------------------------------------------------------- model directories
# A model as transformers 5 saved it (tests/fixtures/make_hf_fixtures.py): config.json with
# rope_parameters, 10 F32 shards and model.safetensors.index.json; with the valid setup's
# DeepSpeed config and its tokens folded into the fixture's vocabulary of 64.
SHARDED=$TMP/sharded
if ! cp -r "$ROOT/tests/fixtures/hf/llama3_f32_v5" "$SHARDED" || ! cp "$VALID/ds_config.json" "$VALID/tokens.bin" "$SHARDED" ||
  ! "$PYTHON" "$MUTATE" retoken "$SHARDED/tokens.bin" 64; then
  echo "FAIL setup: cannot make the sharded model directory $SHARDED"
  FAILED+=(sharded_setup)
fi
sharded_case() {
  CASE=$TMP/cases/$1
  if ! mkdir -p "$TMP/cases" || ! cp -r "$SHARDED" "$CASE"; then
    echo "FAIL $1: cannot copy the sharded setup"
    FAILED+=("$1")
    return 1
  fi
}
INDEX=model.safetensors.index.json
# A tensor of each kind of shard: the first shard's, and one in the middle.
EMBED=model.embed_tokens.weight
Q1=model.layers.1.self_attn.q_proj.weight
shard_of() { "$PYTHON" -c "import json, sys; print(json.load(open(sys.argv[1]))['weight_map'][sys.argv[2]])" "$CASE/$INDEX" "$1"; }

sharded_case sharded_trains &&
  run_expect sharded_trains 0 -- "$AUTOSP" train --config "$CASE/ds_config.json" --model "$CASE" \
    --data "$CASE/tokens.bin" --seq-len 16 --steps 1
expect_stdout sharded_trains "loaded $CASE/$INDEX"
expect_stdout sharded_trains "step 1/1"

sharded_case index_not_json && printf '{"weight_map": {"%s": ' "$EMBED" >"$CASE/$INDEX" &&
  train_case index_not_json "$CASE/$INDEX" "not valid JSON"
sharded_case index_no_weight_map && printf '{"metadata": {"total_size": 78464}}' >"$CASE/$INDEX" &&
  train_case index_no_weight_map "$CASE/$INDEX" '"weight_map"'
sharded_case index_tensor_twice_in_map && "$PYTHON" -c "
import sys; p = sys.argv[1]; t = open(p).read()
open(p, 'w').write(t.replace('\"weight_map\": {', '\"weight_map\": {\n    \"$Q1\": \"model-00001-of-00010.safetensors\",', 1))" \
  "$CASE/$INDEX" && train_case index_tensor_twice_in_map "$CASE/$INDEX" "tensor '$Q1' is listed twice"
sharded_case index_shard_missing && SHARD=$(shard_of "$Q1") && rm "$CASE/$SHARD" &&
  train_case index_shard_missing "$CASE/$SHARD" "no such shard file" "$CASE/$INDEX maps tensors" "and 1 more"
sharded_case index_tensor_not_in_its_shard && SHARD=$(shard_of "$Q1") && mutate shard-drop "$CASE" "$Q1" &&
  train_case index_tensor_not_in_its_shard "$CASE/$SHARD" "missing tensor '$Q1'" "$CASE/$INDEX maps to it"
sharded_case index_shard_tensor_not_in_map && SHARD=$(shard_of "$Q1") && mutate unmap "$CASE" "$Q1" &&
  train_case index_shard_tensor_not_in_map "$CASE/$SHARD" "tensor '$Q1' is not in $CASE/$INDEX"
# The embedding is alone in the first shard: unlisted, that shard is not read at all.
sharded_case index_forgets_a_shard && SHARD=$(shard_of "$EMBED") && mutate unmap "$CASE" "$EMBED" &&
  train_case index_forgets_a_shard "$CASE/$INDEX: missing tensor '$EMBED'" "$CASE/$SHARD is in the directory"
sharded_case index_tensor_in_two_shards && mutate shard-dup "$CASE" "$Q1" &&
  train_case index_tensor_in_two_shards "$CASE/$INDEX" "tensor '$Q1' is in two shards"
sharded_case index_shard_names_a_path &&
  mutate json "$CASE/$INDEX" "c['weight_map']['$Q1'] = '../elsewhere.safetensors'" &&
  train_case index_shard_names_a_path "$CASE/$INDEX" "'$Q1'" "../elsewhere.safetensors"
# A shard's own header is checked as a single file's is, naming the shard.
sharded_case index_shard_wrong_shape && SHARD=$(shard_of "$Q1") && mutate shape "$CASE/$SHARD" "$Q1" 32,31 &&
  train_case index_shard_wrong_shape "$CASE/$SHARD" "tensor '$Q1' has shape [32, 31]"
sharded_case shards_without_index && rm "$CASE/$INDEX" &&
  train_case shards_without_index "model-00001-of-00010.safetensors" "$INDEX"
# transformers 4 and 5 read different rope keys: where both are given they must agree.
sharded_case config_rope_keys_disagree && mutate json "$CASE/config.json" 'c["rope_theta"] = 10000.0' &&
  train_case config_rope_keys_disagree "$CASE/config.json" "rope_parameters.rope_theta and rope_theta" "disagree"
sharded_case config_unknown_key_warns && mutate json "$CASE/config.json" 'c["no_such_llama_key"] = 1' &&
  run_expect config_unknown_key_warns 0 "warning" "$CASE/config.json" "no_such_llama_key" -- "$AUTOSP" train \
    --config "$CASE/ds_config.json" --model "$CASE" --data "$CASE/tokens.bin" --seq-len 16 --steps 1

# checkpoint.max_shard_size is a size as transformers' max_shard_size takes it.
for bad in '"5":has no unit' '"0GB":out of range' '"fiveGB":expected a number before the unit' '1.5:expected a size'; do
  value=${bad%%:*} needle=${bad#*:}
  name=ds_max_shard_size_${value//[^a-zA-Z0-9]/_}
  new_case "$name" && mutate json "$CASE/ds_config.json" "c['checkpoint'] = {'max_shard_size': $value}" &&
    train_case "$name" "$CASE/ds_config.json: checkpoint.max_shard_size" "$needle"
done
# A checkpoint of a bf16 model resumes from its fp32 masters; one without them (its manifest
# made to agree) is refused rather than resumed from rounded weights.
sharded_case bf16_checkpoint_without_masters && rm -rf "$CASE"/* && cp -r "$ROOT/tests/fixtures/hf/llama3_bf16_v5/." "$CASE" &&
  cp "$VALID/ds_config.json" "$SHARDED/tokens.bin" "$CASE" &&
  run_expect bf16_checkpoint_saves 0 -- "$AUTOSP" train --config "$CASE/ds_config.json" --model "$CASE" \
    --data "$CASE/tokens.bin" --seq-len 16 --steps 1 --save "$CASE/ck" &&
  mutate drop "$CASE/ck/optimizer.safetensors" master.model.norm.weight && mutate remanifest "$CASE/ck" &&
  expect_error bf16_checkpoint_without_masters "$CASE/ck/optimizer.safetensors: missing tensor 'master.model.norm.weight'" -- \
    "$AUTOSP" train --config "$CASE/ds_config.json" --resume "$CASE/ck" --data "$CASE/tokens.bin" --steps 2

# plan and dump read config.json as train does: an unknown key is warned about, once.
sharded_case config_unknown_key_plan_dump && mutate json "$CASE/config.json" 'c["no_such_llama_key"] = 1' &&
  run_expect config_unknown_key_plan 0 "warning" "no_such_llama_key" -- "$AUTOSP" plan --model "$CASE" \
    --device-memory 1GiB &&
  run_expect config_unknown_key_dump 0 "warning" "no_such_llama_key" -- "$AUTOSP" dump --model "$CASE" \
    --seq-len 16 --stage forward
for name in config_unknown_key_plan config_unknown_key_dump config_unknown_key_warns; do
  if [ "$(grep -c no_such_llama_key "$TMP/$name.stderr" 2>/dev/null)" != 1 ]; then
    echo "FAIL $name: the unknown key is not warned about exactly once"
    FAILED+=("${name}_once")
  fi
done

# Context extension: a resume at another sequence length with another rope trains on, the
# data position converted in tokens; a --model that changes more than the rope is refused.
sharded_case resume_context_extension && mkdir -p "$CASE/long" && cp "$CASE/config.json" "$CASE/long/" &&
  mutate json "$CASE/long/config.json" "c['rope_parameters'] = {'rope_type': 'yarn', 'rope_theta': 500000.0, 'factor': 2.0, 'original_max_position_embeddings': 32}; c['max_position_embeddings'] = 128" &&
  run_expect resume_context_extension_trains 0 -- "$AUTOSP" train --config "$CASE/ds_config.json" --model "$CASE" \
    --data "$CASE/tokens.bin" --seq-len 16 --steps 1 --save "$CASE/ck" &&
  run_expect resume_context_extension 0 -- "$AUTOSP" train --config "$CASE/ds_config.json" --resume "$CASE/ck" \
    --model "$CASE/long" --data "$CASE/tokens.bin" --seq-len 24 --steps 2 &&
  expect_stdout resume_context_extension "context extension: sequence length 16 (checkpoint) -> 24" &&
  expect_stdout resume_context_extension "samples of 16 tokens -> " &&
  mutate json "$CASE/long/config.json" "c['intermediate_size'] = 64" &&
  expect_error resume_context_extension_other_model "intermediate_size" "only the rope settings and max_position_embeddings" -- \
    "$AUTOSP" train --config "$CASE/ds_config.json" --resume "$CASE/ck" --model "$CASE/long" --data "$CASE/tokens.bin" \
    --seq-len 24 --steps 2

# Weights autosp cannot read are an error that says why and how to convert, never a random
# init: a real torch.save file, a GGUF file (by its name).
new_case weights_pickle_only && rm "$CASE/model.safetensors" &&
  "$PYTHON" -c "import sys, torch; torch.save({'model.norm.weight': torch.ones(32)}, sys.argv[1])" \
    "$CASE/pytorch_model.bin" &&
  train_case weights_pickle_only "$CASE/pytorch_model.bin" "pickle" "can run any code" "save_pretrained" \
    "safe_serialization=True"
new_case weights_gguf_only && rm "$CASE/model.safetensors" && printf 'GGUF\3\0\0\0' >"$CASE/model-q8_0.gguf" &&
  train_case weights_gguf_only "$CASE/model-q8_0.gguf" "GGUF" "gguf_file='model-q8_0.gguf'"
# No weight file at all: the random init, said first. The token file beside config.json is
# not taken for a weight file.
new_case weights_none_random_init && rm "$CASE/model.safetensors" &&
  run_expect weights_none_random_init 0 -- "$AUTOSP" train --config "$CASE/ds_config.json" --model "$CASE" \
    --data "$CASE/tokens.bin" --seq-len 16 --steps 1
if ! head -n 1 "$TMP/weights_none_random_init.stdout" 2>/dev/null | grep -qF "no weights: random init with seed"; then
  echo "FAIL weights_none_random_init: the first line of stdout does not say 'no weights: random init'"
  FAILED+=(weights_none_random_init_first_line)
fi
# Older exports carry the rotary buffers transformers ignores: skipped, with a note.
new_case weights_inv_freq_skipped &&
  mutate add-tensor "$CASE/model.safetensors" model.layers.0.self_attn.rotary_emb.inv_freq 4 &&
  mutate add-tensor "$CASE/model.safetensors" model.layers.1.self_attn.rotary_emb.inv_freq 4 &&
  run_expect weights_inv_freq_skipped 0 -- "$AUTOSP" train --config "$CASE/ds_config.json" --model "$CASE" \
    --data "$CASE/tokens.bin" --seq-len 16 --steps 1
expect_stdout weights_inv_freq_skipped "skipped 2 rotary_emb.inv_freq buffers"

# ---------------------------------------------------------------------------- command line
run_expect cli_help_exits_0 0 -- "$AUTOSP" train --help

# Flag parsing and validation errors are user errors too: same prefix, same exit code.
new_case cli_config_missing_file &&
  expect_error cli_config_missing_file "--config" "$CASE/no_such_ds_config.json" -- "$AUTOSP" train \
    --config "$CASE/no_such_ds_config.json" --model "$CASE" --data "$CASE/tokens.bin" --seq-len 16 --steps 1

new_case cli_seq_len_zero &&
  expect_error cli_seq_len_zero "--seq-len" -- "$AUTOSP" train --config "$CASE/ds_config.json" \
    --model "$CASE" --data "$CASE/tokens.bin" --seq-len 0 --steps 1

new_case cli_unknown_option &&
  expect_error cli_unknown_option "--no-such-flag" -- "$AUTOSP" train --config "$CASE/ds_config.json" \
    --model "$CASE" --data "$CASE/tokens.bin" --seq-len 16 --steps 1 --no-such-flag

# The hint names the subcommand's help, where the flags are listed.
new_case cli_hint_names_the_subcommand &&
  expect_error cli_hint_names_the_subcommand "see autosp train --help" -- "$AUTOSP" train \
    --config "$CASE/ds_config.json" --model "$CASE" --data "$CASE/tokens.bin" --seq-len 16 --steps x

new_case cli_save_every_without_save &&
  expect_error cli_save_every_without_save "--save-every 2 needs --save" -- "$AUTOSP" train \
    --config "$CASE/ds_config.json" --model "$CASE" --data "$CASE/tokens.bin" --seq-len 16 --steps 1 \
    --save-every 2

# --save refuses, before training, anything but a new or empty directory or its own checkpoint.
new_case cli_save_into_the_model_dir &&
  expect_error cli_save_into_the_model_dir "--save $CASE" "tokens.bin" -- "$AUTOSP" train \
    --config "$CASE/ds_config.json" --model "$CASE" --data "$CASE/tokens.bin" --seq-len 16 --steps 1 \
    --save "$CASE"

new_case cli_save_onto_a_file && touch "$CASE/a_file" &&
  expect_error cli_save_onto_a_file "not a directory" -- "$AUTOSP" train \
    --config "$CASE/ds_config.json" --model "$CASE" --data "$CASE/tokens.bin" --seq-len 16 --steps 1 \
    --save "$CASE/a_file"

# A fresh run never replaces a checkpoint or a metrics log unasked: a requeued job that forgot
# --resume would lose them. --resume CK --save CK is the usual restart; --overwrite replaces.
new_case cli_save_onto_a_checkpoint && cp -r "$CHECKPOINT" "$CASE/ck" &&
  expect_error cli_save_onto_a_checkpoint "--save $CASE/ck: holds an autosp checkpoint (step 1)" \
    "pass --resume $CASE/ck" "pass --overwrite" -- "$AUTOSP" train --config "$CASE/ds_config.json" \
    --model "$CASE" --data "$CASE/tokens.bin" --seq-len 16 --steps 1 --save "$CASE/ck" &&
  cp -r "$CHECKPOINT" "$CASE/ck2" &&
  expect_error cli_save_onto_another_checkpoint "--save $CASE/ck2: holds an autosp checkpoint" \
    "it resumes from $CASE/ck" -- "$AUTOSP" train --config "$CASE/ds_config.json" \
    --resume "$CASE/ck" --data "$CASE/tokens.bin" --steps 2 --save "$CASE/ck2" &&
  run_expect cli_save_onto_a_checkpoint_overwrite 0 -- "$AUTOSP" train --config "$CASE/ds_config.json" \
    --model "$CASE" --data "$CASE/tokens.bin" --seq-len 16 --steps 2 --save "$CASE/ck" --overwrite &&
  expect_stdout cli_save_onto_a_checkpoint_overwrite "saved $CASE/ck at step 2"
new_case cli_metrics_not_empty && echo '{"step": 1}' >"$CASE/m.jsonl" &&
  expect_error cli_metrics_not_empty "--metrics $CASE/m.jsonl: exists and is not empty" "--resume" "--overwrite" -- \
    "$AUTOSP" train --config "$CASE/ds_config.json" --model "$CASE" --data "$CASE/tokens.bin" --seq-len 16 \
    --steps 1 --metrics "$CASE/m.jsonl"
new_case cli_keep_position_alone &&
  expect_error cli_keep_position_alone "--keep-data-position only applies with --allow-new-data" -- "$AUTOSP" train \
    --config "$CASE/ds_config.json" --resume "$CHECKPOINT" --data "$CASE/tokens.bin" --steps 2 --keep-data-position

new_case cli_metrics_unwritable &&
  expect_error cli_metrics_unwritable "--metrics" "$CASE/no_such_dir/metrics.jsonl" -- "$AUTOSP" train \
    --config "$CASE/ds_config.json" --model "$CASE" --data "$CASE/tokens.bin" --seq-len 16 --steps 1 \
    --metrics "$CASE/no_such_dir/metrics.jsonl"

# A regular file where the checkpoint's parent directory should be.
new_case cli_save_under_a_file && touch "$CASE/a_file" &&
  expect_error cli_save_under_a_file "$CASE/a_file/checkpoint" -- "$AUTOSP" train \
    --config "$CASE/ds_config.json" --model "$CASE" --data "$CASE/tokens.bin" --seq-len 16 --steps 1 \
    --save "$CASE/a_file/checkpoint"

new_case cli_missing_data &&
  expect_error cli_missing_data "--data" -- "$AUTOSP" train --config "$CASE/ds_config.json" \
    --model "$CASE" --seq-len 16 --steps 1

new_case cli_resume_not_a_checkpoint && mkdir "$CASE/not_a_checkpoint" &&
  expect_error cli_resume_not_a_checkpoint "$CASE/not_a_checkpoint" -- "$AUTOSP" train \
    --config "$CASE/ds_config.json" --resume "$CASE/not_a_checkpoint" --data "$CASE/tokens.bin" --steps 1

# The model directory itself: config.json and weights, but no trainer state.
new_case cli_resume_model_dir &&
  expect_error cli_resume_model_dir "$CASE" "not an autosp checkpoint" -- "$AUTOSP" train \
    --config "$CASE/ds_config.json" --resume "$CASE" --data "$CASE/tokens.bin" --steps 1

# resume_case NAME NEEDLE...: resumes from the case's copy of the checkpoint ($CASE/checkpoint).
resume_case() {
  local name=$1
  shift
  expect_error "$name" "$@" -- "$AUTOSP" train --config "$CASE/ds_config.json" \
    --resume "$CASE/checkpoint" --data "$CASE/tokens.bin" --steps 2
}

# A checkpoint's manifest (each file's size and checksum) refuses any edit first ...
new_case resume_manifest_flipped_byte && cp -r "$CHECKPOINT" "$CASE/checkpoint" &&
  printf 'X' | dd of="$CASE/checkpoint/model.safetensors" bs=1 seek=100 conv=notrunc status=none &&
  resume_case resume_manifest_flipped_byte "$CASE/checkpoint/model.safetensors" "differs from the manifest"

new_case resume_manifest_truncated && cp -r "$CHECKPOINT" "$CASE/checkpoint" &&
  mutate truncate "$CASE/checkpoint/optimizer.safetensors" mid-data &&
  resume_case resume_manifest_truncated "$CASE/checkpoint/optimizer.safetensors" "(truncated)"

new_case resume_manifest_missing && cp -r "$CHECKPOINT" "$CASE/checkpoint" &&
  rm "$CASE/checkpoint/manifest.json" &&
  resume_case resume_manifest_missing "$CASE/checkpoint/manifest.json" "missing"

new_case verify_damaged && cp -r "$CHECKPOINT" "$CASE/checkpoint" &&
  rm "$CASE/checkpoint/config.json" &&
  expect_error verify_damaged "autosp verify" "$CASE/checkpoint/config.json: missing" -- "$AUTOSP" verify "$CASE/checkpoint"
new_case verify_not_a_checkpoint &&
  expect_error verify_not_a_checkpoint "$CASE: not an autosp checkpoint" -- "$AUTOSP" verify "$CASE"
new_case verify_no_such_dir &&
  expect_error verify_no_such_dir "no such directory" -- "$AUTOSP" verify "$CASE/nothing_here"
run_expect verify_valid_checkpoint 0 -- "$AUTOSP" verify "$CHECKPOINT"

# ... so the checks of each file's contents are those of a checkpoint without a manifest
# (an older autosp's): the same edits with the manifest removed.
without_manifest() {
  rm "$CASE/checkpoint/manifest.json" && mutate json "$CASE/checkpoint/trainer_state.json" 'c.pop("manifest")'
}
new_case resume_state_not_json && cp -r "$CHECKPOINT" "$CASE/checkpoint" && rm "$CASE/checkpoint/manifest.json" &&
  printf '{"step": 1,' >"$CASE/checkpoint/trainer_state.json" &&
  resume_case resume_state_not_json "$CASE/checkpoint/trainer_state.json" "JSON"

new_case resume_state_seq_len_0 && cp -r "$CHECKPOINT" "$CASE/checkpoint" && without_manifest &&
  mutate json "$CASE/checkpoint/trainer_state.json" 'c["seq_len"] = 0' &&
  resume_case resume_state_seq_len_0 "$CASE/checkpoint/trainer_state.json" "seq_len"

new_case resume_optimizer_truncated && cp -r "$CHECKPOINT" "$CASE/checkpoint" && without_manifest &&
  mutate truncate "$CASE/checkpoint/optimizer.safetensors" mid-data &&
  resume_case resume_optimizer_truncated "$CASE/checkpoint/optimizer.safetensors" "ends beyond the"

# --comm-timeout: seconds, >= 0.
for bad in -1 abc nan; do
  new_case "cli_comm_timeout_$bad" &&
    run_expect "cli_comm_timeout_$bad" 1 "--comm-timeout" -- "$AUTOSP" train --config "$CASE/ds_config.json" \
      --model "$CASE" --data "$CASE/tokens.bin" --seq-len 16 --steps 1 --comm-timeout "$bad"
done

# Not an error: a checkpoint autosp wrote with the largest --seed must load again.
new_case cli_seed_above_int64 &&
  expect_error cli_seed_above_int64 "--seed 18446744073709551615: expected an integer in [0, 2^63)" -- "$AUTOSP" train \
    --config "$CASE/ds_config.json" --model "$CASE" --data "$CASE/tokens.bin" --seq-len 16 \
    --steps 1 --seed 18446744073709551615

new_case cli_dump_unknown_stage &&
  expect_error cli_dump_unknown_stage "no_such_stage" -- "$AUTOSP" dump --model "$CASE" --seq-len 16 \
    --stage no_such_stage

# Backends: lower refuses at compile time, on a machine without a GPU, what a backend's kernels
# cannot run: bf16 on the CPU's fp32 kernels, a head dim above the cuda attention kernel's 256.
expect_error dump_backend_unknown "unknown backend 'metal'" -- \
  "$AUTOSP" dump --model "$VALID" --seq-len 16 --stage lower --backend metal
expect_error dump_cpu_bf16 "--backend cpu --dtype bf16" "CPU kernels are fp32" -- \
  "$AUTOSP" dump --model "$VALID" --seq-len 16 --stage lower --backend cpu --dtype bf16
expect_error plan_cpu_bf16 "--backend cpu --dtype bf16" "CPU kernels are fp32" -- \
  "$AUTOSP" plan --model "$VALID" --device-memory 80GiB --backend cpu
new_case cuda_head_dim_over_limit && mutate json "$CASE/config.json" 'c["head_dim"] = 512' &&
  expect_error cuda_head_dim_over_limit "cuda backend: rope" "head dim" "256" -- \
    "$AUTOSP" dump --model "$CASE" --seq-len 16 --stage lower --backend cuda --dtype bf16

# autosp plan: sizes need a unit, numbers out of range and layouts that cannot shard are user
# errors in the flags' words.
expect_error plan_size_without_unit "--device-memory 80: a size needs a unit" "e.g. 80GiB" -- \
  "$AUTOSP" plan --model "$VALID" --device-memory 80
expect_error plan_size_out_of_range "--device-memory 1e30GiB: out of range" -- \
  "$AUTOSP" plan --model "$VALID" --device-memory 1e30GiB
expect_error plan_world_out_of_range "--world" "9223372036854775807" "not in range 1 to 1048576" -- \
  "$AUTOSP" plan --model "$VALID" --device-memory 80GiB --world 9223372036854775807
# A program is planned too: one its heads cannot shard, or whose position table is shorter than
# the shortest length planned, is refused at that length, naming the program.
expect_error plan_torch_program_heads "--model" "mixtral/model.pt2 at --sp 3, S = 3072" \
  "not divisible by sequence_parallel_size P=3" -- \
  "$AUTOSP" plan --model "$ROOT/tests/fixtures/torch_export/mixtral/model.pt2" --device-memory 80GiB --world 3 --sp 3
expect_error plan_torch_program_positions "gpt2/model.pt2 at --sp 1, S = 1024" \
  "a learned position table of 64 rows read at the positions of S = 1024" -- \
  "$AUTOSP" plan --model "$ROOT/tests/fixtures/torch_export/gpt2/model.pt2" --device-memory 80GiB
expect_error plan_heads_not_divisible "num_attention_heads 4 is not divisible by --sp 3" \
  "sizes this model can use: 1, 2, 4" -- "$AUTOSP" plan --model "$VALID" --device-memory 80GiB --world 3 --sp 3

# The kernels' instruction set, chosen with AUTOSP_ISA (kernels/cpu/isa.h): an unknown name
# is an error naming the variable, before anything runs.
new_case env_isa_unknown &&
  expect_error env_isa_unknown "AUTOSP_ISA=sse4" "expected avx2 or avx512" -- env AUTOSP_ISA=sse4 "$AUTOSP" train \
    --config "$CASE/ds_config.json" --model "$CASE" --data "$CASE/tokens.bin" --seq-len 16 --steps 1

# ---------------------------------------------------------------------------- summary
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "${#FAILED[@]} of $NUM_CASES cases failed: ${FAILED[*]}"
  exit 1
fi
echo "all $NUM_CASES cases passed"
