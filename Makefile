# lora-share: every target sets up what it needs, so `make demo` and `make test` work on a fresh machine.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
SETUP_STAMP := $(VENV)/.lora-share-installed
RUNNER := build/runner
CONFIG ?= configs/llama_adapters.yaml
OUT ?= out/llama_adapters

.PHONY: all setup runner demo test bench bench-scale bench-budget bench-peers clean system-deps

all: setup runner

# Compilers, CMake, the tokenizer's libraries and the server's HTTP library (cpp-httplib) for the C++
# runtime (installed from Debian when missing).
system-deps:
	@command -v cmake >/dev/null && command -v g++ >/dev/null || { \
	  echo "installing cmake and g++ from Debian"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake g++ make; }
	@dpkg -s nlohmann-json3-dev libpcre2-dev libutf8proc-dev libssl-dev libcpp-httplib-dev pkg-config >/dev/null 2>&1 || { \
	  echo "installing the tokenizer's and the server's libraries (JSON, PCRE2, utf8proc, OpenSSL, cpp-httplib) from Debian"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    nlohmann-json3-dev libpcre2-dev libutf8proc-dev libssl-dev libcpp-httplib-dev pkg-config; }

# The venv: torch pinned to 2.13.0 (the CPU build), executorch 1.5.1, this package editable, the test
# tools and the benchmark's plotting library (so the plot test runs too).
$(SETUP_STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $@

setup: $(SETUP_STAMP)

# The C++ runner and the library it links (build/liblora_share.so; installed with its header and
# CMake package into build/install for applications), built against the runtime shipped in the
# executorch wheel (never from source).
$(RUNNER): $(SETUP_STAMP) $(wildcard cpp_runner/* cpp_runner/*/*) | system-deps
	cmake -S cpp_runner -B build/cmake -DCMAKE_BUILD_TYPE=Release \
	  -DCMAKE_PREFIX_PATH="$$($(PY) -c 'import importlib.util as u; print(u.find_spec("executorch").submodule_search_locations[0])')" >/dev/null
	cmake --build build/cmake -j2
	cmake --install build/cmake --prefix build/install >/dev/null

runner: $(RUNNER)

# The default config: four adapters trained on toy tasks (examples/demo/train_adapters.py, committed,
# never retrained here) over one synthetic foundation, each answering the same prompt in its own way.
DEMO_PROMPT ?= 1 2 3
DEMO_PTES := $(foreach a,counter countdown doubler speller,--pte $(OUT)/$(a).pte)

demo: setup runner
	$(VENV)/bin/lora-share build $(CONFIG)
	@echo "--- build/runner --serve (C++): one process, one foundation.ptd, every adapter asked '$(DEMO_PROMPT)':"
	$(PY) examples/demo/show.py $(OUT) --prompt '$(DEMO_PROMPT)' --runner $(RUNNER)
	@echo "--- lora-share run (Python runtime), counter:"
	$(VENV)/bin/lora-share run --pte $(OUT)/counter.pte --ptd $(OUT)/foundation.ptd --prompt '$(DEMO_PROMPT)'
	@echo "--- build/runner (C++): all four loaded, speller answers; memory after load and at the end:"
	$(RUNNER) --ptd $(OUT)/foundation.ptd $(DEMO_PTES) --adapter speller --prompt '$(DEMO_PROMPT)'

test: setup runner
	$(PY) -m pytest -q

# lora-share vs stand-alone programs vs stock ExecuTorch, N = 1, 2, 4, 8 adapters -> benchmarks/results/
bench: setup runner
	$(VENV)/bin/lora-share bench $(CONFIG)

# SmolLM-135M's shape at a 2,048-token context, fp32 and 8da4w: memory with 1, 2, 4, 8 adapters served
# (shared arena vs private arenas vs one process each), prefill and decode speed, load and export time.
# The builds are kept in out/bench_scale and reused while nothing changed.
bench-scale: setup runner
	$(VENV)/bin/lora-share bench-scale

# 32 adapters served under a memory budget that holds 4: PSS against the budget, a request whose
# adapter is resident vs one that must be loaded (p50, p99), requests/s of a mixed stream, against
# all 32 loaded. The build is kept in out/bench_budget and reused while nothing changed.
bench-budget: setup runner
	$(VENV)/bin/lora-share bench-budget $(CONFIG)

# lora-share vs llama.cpp on SmolLM2-135M-Instruct (issue 23), one adapter applied on both sides. llama.cpp
# comes from llama-cpp-python 0.3.36's sdist (PyPI) and is built once into out/peers (never committed).
PEERS_GGUF ?= models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
bench-peers: setup runner
	$(VENV)/bin/lora-share bench-peers --gguf $(PEERS_GGUF)

clean:
	rm -rf build out .pytest_cache
