#!/usr/bin/env bash
# transformers 5 beside the bench venv's torch (scripts/install_bench_venv.sh), for writing the
# transformers 5 fixtures (tests/fixtures/make_torch_export_fixtures.py: the NAME_tf5 ones) and
# for the family survey under it (scripts/hf_family_survey.py). A virtual environment whose
# site-packages lead and whose .pth file adds the bench venv's after them, so torch and numpy are
# the bench venv's (no second 4 GB download) and transformers is this one's. Outside the source
# tree and cached between runs:
#   ${AUTOSP_TF5_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/autosp/tf5-venv}
# Idempotent: a venv that already imports the pinned transformers installs nothing. Prints the
# venv's python on its last line of stdout.
set -euo pipefail

version=5.25.0
here="$(cd "$(dirname "$0")" && pwd)"
bench_python="$("$here/install_bench_venv.sh" | tail -n 1)"
venv="${AUTOSP_TF5_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/autosp/tf5-venv}"
python="$venv/bin/python"

installed() {
  [ -x "$python" ] && "$python" -c "
import sys, transformers, torch
sys.exit(transformers.__version__ != '$version')" 2>/dev/null
}

if ! installed; then
  echo "install_transformers5_venv: transformers $version into $venv (torch from $bench_python)" >&2
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  /usr/bin/python3 -m venv "$venv"
  bench_site="$("$bench_python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  own_site="$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  echo "$bench_site" > "$own_site/autosp_bench_venv.pth"
  # (pip sees the bench venv's torch and numpy as installed; its transformers 4 it leaves alone,
  # being outside this environment, and this one's own comes first on sys.path)
  if ! "$python" -m pip install --quiet --disable-pip-version-check "transformers==$version"; then
    rm -rf "$venv"
    echo "install_transformers5_venv: pip could not install transformers $version (see above)" >&2
    exit 1
  fi
  installed || { echo "install_transformers5_venv: $venv does not import transformers $version" >&2; exit 1; }
  "$python" -c "import torch, transformers; print('install_transformers5_venv: torch', torch.__version__,
      'transformers', transformers.__version__)" >&2
fi
echo "$python"
