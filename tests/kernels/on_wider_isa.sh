#!/usr/bin/env bash
# on_wider_isa.sh AUTOSP COMMAND...: runs COMMAND (a test run with AUTOSP_ISA=avx2) only where
# the CPU also runs the avx512 kernels. On an AVX2-only CPU the default test run already runs
# the avx2 copies, so the command would repeat it: exit 77, which ctest reports as skipped.
set -u
autosp=$1
shift
if ! sets=$("$autosp" --version | grep '^cpu kernels:'); then
  echo "on_wider_isa.sh: '$autosp --version' printed no 'cpu kernels:' line" >&2
  exit 1
fi
# "cpu kernels: avx512 (this CPU runs: avx2 avx512; AUTOSP_ISA=avx2|avx512 chooses)"
runs=$(printf '%s\n' "$sets" | sed -n 's/.*this CPU runs: \([^;)]*\).*/\1/p')
if [ -z "$runs" ]; then
  echo "on_wider_isa.sh: no 'this CPU runs:' in '$sets'" >&2
  exit 1
fi
case " $runs " in
  *" avx512 "*) exec "$@" ;;
  *) echo "skipped: this CPU runs only the $runs kernels, which the default run already tested"
     exit 77 ;;
esac
