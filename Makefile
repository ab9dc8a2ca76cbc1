# `make demo` and `make test` each create .venv and install the project when needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow lint clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

DEMO := out/demo

# The main job: list the cards, build the default card, export it to ONNX (with the parity
# table), and generate from token ids with ONNX Runtime.
demo: $(STAMP)
	$(BIN)/zoo list
	$(BIN)/zoo build gpt-tiny -o $(DEMO)/gpt-tiny --seed 0 --force
	$(BIN)/zoo export $(DEMO)/gpt-tiny --onnx -o $(DEMO)/gpt-tiny-onnx --force
	$(BIN)/zoo run $(DEMO)/gpt-tiny-onnx --ids 72,101,108,108,111 --max-new-tokens 16

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info
