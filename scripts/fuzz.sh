#!/usr/bin/env bash
# Runs each libFuzzer target of build-fuzz for FUZZ_SECONDS (default 60) from the seed corpus
# in fuzz/corpus/<target>/ (read only: new inputs go to build-fuzz/corpus/<target>/), then
# prints per target the executions and the coverage libFuzzer reached (cov: edges, ft:
# features) from its final lines. A crash, leak, timeout or out-of-memory leaves its input in
# build-fuzz/artifacts/<target>/ and fails the run; copy it into fuzz/corpus/<target>/ as a
# regression input (crash-*) once the parser is fixed, so `make test` replays it.
# Usage: scripts/fuzz.sh BUILD_DIR [TARGET...]
set -uo pipefail
build=${1:?usage: scripts/fuzz.sh BUILD_DIR [TARGET...]}
shift
seconds=${FUZZ_SECONDS:-60}
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(safetensors model_config ds_config ir_text tokens indexed_dataset model_index)
root=$(cd "$(dirname "$0")/.." && pwd)
failed=()
summary=""
for t in "${targets[@]}"; do
  dict=()
  case $t in
    model_config|ds_config|safetensors|model_index) dict=(-dict="$root/fuzz/json.dict") ;;
    ir_text) dict=(-dict="$root/fuzz/ir.dict") ;;
  esac
  mkdir -p "$build/corpus/$t" "$build/artifacts/$t" "$build/logs"
  log="$build/logs/$t.log"
  echo "fuzz: $t for ${seconds}s (log $log)"
  # -timeout: an input that takes 10 s is a hang; -rss_limit_mb: a parser must not need 2 GiB.
  "$build/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    "${dict[@]}" -artifact_prefix="$build/artifacts/$t/" "$build/corpus/$t" "$root/fuzz/corpus/$t" \
    >"$log" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  final=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' <<<"$final" | grep -o '[0-9]*')
  ft=$(grep -o 'ft: [0-9]*' <<<"$final" | grep -o '[0-9]*')
  corp=$(grep -o 'corp: [0-9]*' <<<"$final" | grep -o '[0-9]*')
  line=$(printf '%-13s %6ss  execs %-10s cov %-6s ft %-6s corpus %-5s exit %s' "$t" "$seconds" \
    "${execs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$rc")
  echo "fuzz: $line"
  summary+="$line"$'\n'
  if [ $rc -ne 0 ] || [ -n "$(ls -A "$build/artifacts/$t")" ]; then
    failed+=("$t")
    grep -E 'ERROR|SUMMARY|==[0-9]+==|Test unit written' "$log" | head -20
  fi
done
printf '\nfuzz summary (%s):\n%s' "$(lscpu | grep 'Model name' | sed 's/ \+/ /g')" "$summary"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]} (inputs in $build/artifacts/)"
  exit 1
fi
