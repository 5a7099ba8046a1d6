#!/usr/bin/env bash
# install_cudnn_frontend.sh: the cudnn-frontend headers (header-only C++, NVIDIA's graph API over
# cuDNN) that the cuda backend's fused attention is written against (ops/cuda_attention_cudnn.cpp).
# They come from PyPI's nvidia-cudnn-frontend wheel, which ships them under include/; only that
# folder is kept, in
#   <repo>/.deps/cudnn-frontend-<version>/include
# inside the tree (.gitignore lists .deps), so that a GPU machine without PyPI gets them when
# a device run carries .deps. CMake looks there (or in -DAUTOSP_CUDNN_FRONTEND_DIR=...).
# Idempotent: an existing install of the pinned version returns at once. No venv: pip only
# downloads the wheel (pinned by hash) and unzip unpacks its include/.
#
# 1.32.0: the newest 1.x on PyPI (October 2026). It is written to run on any cuDNN 9.x: features of
# a newer cuDNN are gated at run time on the loaded library's version, and the SDPA support checks
# (include/cudnn_frontend/node/sdpa_support_surface.h) know 9.19, the cuDNN this project builds with.
# The wheel is a CPython extension built per Python version; the headers in it are not, so one
# wheel (cp311, manylinux x86_64) is pinned whatever python runs this script.
set -euo pipefail

version=1.32.0
wheel="nvidia_cudnn_frontend-${version}-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"
sha256=c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/.deps/cudnn-frontend-$version"
if [ -f "$dest/include/cudnn_frontend.h" ] && [ -f "$dest/.complete" ]; then
  exit 0
fi

for tool in unzip sha256sum; do
  command -v "$tool" > /dev/null || { echo "install_cudnn_frontend: needs $tool (apt-get install $tool)" >&2; exit 1; }
done
# Any python with pip: the caller's, the system's, or install_hf_venv.sh's venv.
python=""
for p in "${AUTOSP_PYTHON:-}" python3 "${AUTOSP_HF_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/autosp/hf-venv}/bin/python"; do
  if [ -n "$p" ] && "$p" -m pip --version > /dev/null 2>&1; then python=$p; break; fi
done
[ -n "$python" ] ||
  { echo "install_cudnn_frontend: needs a python with pip (apt-get install python3-pip, or scripts/install_hf_venv.sh)" >&2; exit 1; }

echo "install_cudnn_frontend: cudnn-frontend $version headers into $dest"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# --platform / --python-version / --only-binary: the pinned wheel, whatever this machine's python.
"$python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --platform manylinux_2_28_x86_64 --python-version 3.11 --implementation cp \
  -d "$tmp" "nvidia-cudnn-frontend==$version"
[ -f "$tmp/$wheel" ] || { echo "install_cudnn_frontend: pip did not fetch $wheel: $(ls "$tmp")" >&2; exit 1; }
echo "$sha256  $tmp/$wheel" | sha256sum --check --quiet ||
  { echo "install_cudnn_frontend: $wheel does not have the pinned sha256 $sha256" >&2; exit 1; }
rm -rf "$dest"
mkdir -p "$dest"
unzip -q "$tmp/$wheel" 'include/*' -d "$dest"
[ -f "$dest/include/cudnn_frontend.h" ] || { echo "install_cudnn_frontend: the wheel has no include/cudnn_frontend.h" >&2; exit 1; }
grep -q "CUDNN_FRONTEND_MINOR_VERSION $(echo "$version" | cut -d. -f2)\$" "$dest/include/cudnn_frontend_version.h" ||
  { echo "install_cudnn_frontend: the headers are not version $version" >&2; exit 1; }
touch "$dest/.complete"  # last: an interrupted install is redone
