#!/usr/bin/env bash
# isa_check.sh BINARY AVX2_OBJECTS... -- AVX512_OBJECTS...: the default build runs on an
# AVX2-only CPU (kernels/cpu/isa.h). Checks, on the built code itself:
#  1. No function of BINARY outside namespace autosp::cpu::avx512 uses an AVX-512
#     instruction (a zmm or mask register, ymm/xmm 16-31, an embedded broadcast, or an
#     EVEX-only mnemonic), so nothing but the dispatched kernels needs AVX-512.
#  2. The per-instruction-set kernel objects define no weak (COMDAT) function outside their
#     own namespace: the linker keeps one copy of a weak symbol for the whole program, so
#     a library template instantiated in the AVX-512 objects could otherwise be the copy
#     the baseline code calls.
# Prints what it found; exits 1 on any finding.
set -u
if [ $# -lt 3 ]; then
  echo "usage: $0 BINARY AVX2_OBJECTS... -- AVX512_OBJECTS..." >&2
  exit 2
fi
BINARY=$1
shift
AVX2_OBJECTS=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do AVX2_OBJECTS+=("$1"); shift; done
shift
AVX512_OBJECTS=("$@")
status=0

# 1. AVX-512 instructions outside the avx512 kernels.
found=$(objdump -d --no-show-raw-insn -C "$BINARY" | awk '
  /^[0-9a-f]+ <.*>:$/ { fn = $0; next }
  /%zmm|%k[0-7]\b|\{1to[0-9]+\}|%[xy]mm(1[6-9]|2[0-9]|3[01])\b|\tv(pternlog|perm[it]2|pcompress|pexpand|compress|expand|scalef|getexp|getmant|rndscale|reduce|range|fixupimm|rcp14|rsqrt14|prol|pror|pmov[a-z0-9]*2m|movdq[au](8|16|32|64)|(extract|insert|broadcast|shuf)[fi](32|64)x[248]|dbpsadbw|cvtne2ps2bf16|dpbf16ps)/ {
    if (fn !~ /autosp::cpu::avx512::/) print fn
  }' | sort -u)
if [ -n "$found" ]; then
  echo "FAIL: AVX-512 instructions outside autosp::cpu::avx512 in $BINARY:"
  echo "$found" | head -20
  status=1
else
  n=$(objdump -d --no-show-raw-insn -C "$BINARY" | grep -c '%zmm')
  echo "PASS: AVX-512 instructions only in autosp::cpu::avx512 ($n zmm uses there)"
  if [ "$n" -eq 0 ]; then
    echo "FAIL: no zmm instruction at all: the avx512 kernels were not built with AVX-512"
    status=1
  fi
fi

# 2. Weak functions of the kernel objects outside their namespace.
check_weak() {
  local isa=$1
  shift
  local weak
  weak=$(nm -C --defined-only "$@" | awk '$2 ~ /^[WVu]$/' | grep -v "autosp::cpu::$isa::" |
         grep -v 'DW.ref.__gxx_personality_v0' | sort -u)
  if [ -n "$weak" ]; then
    echo "FAIL: weak symbols outside autosp::cpu::$isa in its kernel objects:"
    echo "$weak" | head -20
    status=1
  else
    echo "PASS: the $isa kernel objects define no weak symbol outside autosp::cpu::$isa"
  fi
}
check_weak avx2 "${AVX2_OBJECTS[@]}"
check_weak avx512 "${AVX512_OBJECTS[@]}"
exit $status
