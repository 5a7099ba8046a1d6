#!/usr/bin/env bash
# install_deps.sh [--fuzz]: installs what autosp needs to build and test, from Debian packages,
# if it is missing, and the transformers venv the tests load checkpoints with
# (install_hf_venv.sh, from PyPI). --fuzz adds clang and libFuzzer for `make fuzz`, which
# `make test` does not need (it replays the fuzz corpora in the gcc build). Where nvcc is found
# (the cuda backend builds), also the cudnn-frontend headers of its fused attention
# (install_cudnn_frontend.sh, into .deps/); the CPU-only build needs none of it.
# Idempotent: a machine that has everything installs nothing.
set -euo pipefail

packages=(
  g++ cmake make pkg-config
  unzip  # install_cudnn_frontend.sh unpacks the headers from their wheel
  libopenblas-dev  # the benchmarks' sgemm baseline (autosp's own gemm is kernels/cpu/gemm.h)
  libopenmpi-dev openmpi-bin
  nlohmann-json3-dev libcli11-dev
  zlib1g-dev  # the zip reader inflates deflated archive entries
  libgtest-dev
  python3-torch python3-numpy python3-venv
)
case "${1:-}" in
  "") ;;
  --fuzz) packages+=(clang-14 libclang-rt-14-dev libomp-14-dev) ;;
  *) echo "usage: $0 [--fuzz]" >&2; exit 2 ;;
esac

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python_deps() {
  "$here/install_hf_venv.sh"
  if command -v nvcc > /dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
    "$here/install_cudnn_frontend.sh"
  fi
}
if [ ${#missing[@]} -eq 0 ]; then
  python_deps
  exit 0
fi

echo "install_deps: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
python_deps
