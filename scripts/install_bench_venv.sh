#!/usr/bin/env bash
# The PyTorch people run today, for `make bench`'s main peer (issue 25): torch 2.x with
# transformers' LlamaForCausalLM and scaled_dot_product_attention (bench/torch_llama_step.py
# --impl hf-sdpa). A virtual environment of its own over Debian's python3 without its site
# packages (Debian's torch 1.13 must not shadow it), from PyPI, pinned, outside the source
# tree and cached between runs:
#   ${AUTOSP_BENCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/autosp/bench-venv}
# Idempotent: a venv that already imports the pinned versions installs nothing (3 s). The
# first install downloads about 4 GB and takes 5.6 GB (PyPI's Linux torch wheel depends on
# the CUDA libraries, which the CPU benchmark never loads): 4 minutes here.
# AUTOSP_BENCH_TORCH_INDEX=https://download.pytorch.org/whl/cpu takes PyTorch's CPU-only wheel
# of the same version instead (about 200 MB; same CPU kernels).
# Prints the venv's python on its last line of stdout, for the Makefile.
set -euo pipefail

torch_version=2.15.0
transformers_version=4.57.6
numpy_version=2.4.6
peft_version=0.22.0
accelerate_version=1.16.0
psutil_version=7.2.2
x_transformers_version=2.31.10
venv="${AUTOSP_BENCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/autosp/bench-venv}"
python="$venv/bin/python"

installed() {
  [ -x "$python" ] && "$python" -c "
import sys, numpy, torch, transformers
sys.exit(torch.__version__.split('+')[0] != '$torch_version'
         or transformers.__version__ != '$transformers_version'
         or numpy.__version__ != '$numpy_version')" 2>/dev/null
}

if ! installed; then
  echo "install_bench_venv: torch $torch_version, transformers $transformers_version into $venv" >&2
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  /usr/bin/python3 -m venv "$venv"
  index=()
  [ -n "${AUTOSP_BENCH_TORCH_INDEX:-}" ] && index=(--extra-index-url "$AUTOSP_BENCH_TORCH_INDEX")
  if ! "$python" -m pip install --quiet --disable-pip-version-check "${index[@]}" \
      "torch==$torch_version" "transformers==$transformers_version" "numpy==$numpy_version"; then
    rm -rf "$venv"  # a half-installed venv would fail the check above anyway; leave nothing
    echo "install_bench_venv: pip could not install torch $torch_version (see above); check the" \
         "network or PyPI, or set AUTOSP_BENCH_VENV to a venv that has these versions" >&2
    exit 1
  fi
  installed || { echo "install_bench_venv: $venv does not import the pinned versions after" \
                      "installing them" >&2; exit 1; }
  "$python" -c "import torch, transformers; print('install_bench_venv: torch', torch.__version__,
      'transformers', transformers.__version__)" >&2
fi
# PEFT, for the LoRA fixture (tests/fixtures/make_torch_export_fixtures.py): added to a venv that
# has the rest, without reinstalling it (its own dependencies are the venv's already but two).
if ! "$python" -c "import sys, peft; sys.exit(peft.__version__ != '$peft_version')" 2>/dev/null; then
  "$python" -m pip install --quiet --disable-pip-version-check --no-deps "peft==$peft_version" \
      "accelerate==$accelerate_version" "psutil==$psutil_version" ||
    { echo "install_bench_venv: pip could not install peft $peft_version (see above)" >&2; exit 1; }
fi
# x-transformers, for its fixture (a Decoder as lucidrains' library builds it): likewise, with the
# five small packages it imports.
if ! "$python" -c "import sys, importlib.metadata as m; sys.exit(m.version('x-transformers') != '$x_transformers_version')" \
    2>/dev/null; then
  "$python" -m pip install --quiet --disable-pip-version-check --no-deps "x-transformers==$x_transformers_version" \
      einops==0.8.2 einx==0.4.3 frozendict==2.5.1 torch_einops_utils==0.2.9 loguru==0.8.0 ||
    { echo "install_bench_venv: pip could not install x-transformers $x_transformers_version (see above)" >&2; exit 1; }
fi
echo "$python"
