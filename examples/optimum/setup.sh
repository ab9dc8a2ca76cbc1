#!/usr/bin/env bash
# Makes examples/optimum/.venv: Optimum (optimum-onnx) and sentence-transformers, which load a
# zoo export as a Hugging Face model folder (run.py; tests/clients/test_optimum.py). An environment of
# its own because optimum-onnx needs transformers < 4.58, older than the test extra's.
# Versions pinned in requirements.txt; torch pinned: a bare requirement pulls the CUDA build.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv"
python="${PYTHON:-python3}"

stamp="$venv/.installed"
if [ -f "$stamp" ] && [ "$stamp" -nt "$here/requirements.txt" ]; then
    exit 0
fi
"$python" -m venv --clear "$venv"  # a stale or half-made one is rebuilt from nothing
"$venv/bin/python" -m pip install --quiet -r "$here/requirements.txt"
touch "$stamp"
