#!/usr/bin/env bash
# The Hugging Face peer the tests load autosp's checkpoints with: transformers from PyPI in a
# virtual environment over Debian's python3-torch (1.13, --system-site-packages), so no
# torch wheel is downloaded. Outside the source tree and cached between runs:
#   ${AUTOSP_HF_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/autosp/hf-venv}
# Idempotent: a venv that already imports the pinned transformers installs nothing.
# tests/train/hf_model_dir_test.cpp runs tests/reference/hf_load_checkpoint.py with its python.
# transformers 4.46 is the newest that runs on torch 1.13; it reads the transformers-4 rope
# keys, which autosp's config.json carries beside transformers 5's rope_parameters.
set -euo pipefail

version=4.46.3
venv="${AUTOSP_HF_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/autosp/hf-venv}"
python="$venv/bin/python"

if [ -x "$python" ] && "$python" -c "import transformers, sys; sys.exit(transformers.__version__ != '$version')" 2>/dev/null; then
  exit 0
fi

echo "install_hf_venv: transformers $version into $venv"
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
/usr/bin/python3 -m venv --system-site-packages "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "transformers==$version"
"$python" -c "import torch, transformers; print('install_hf_venv: torch', torch.__version__, 'transformers', transformers.__version__)"
