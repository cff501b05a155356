# `make run`: set up everything, then `specgen demo` (one prompt decoded plainly and with auto,
# compared). `make test`: set up, then the test suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TEST_MODELS := smollm2-135m-instruct-q4_1 gemma-3-270m-q4_k_m smollm2-135m-instruct-f32 smollm2-135m-instruct-q4_0 smollm2-135m-instruct-q5_1 gemma-3-270m-f32 gemma-3-270m-q2_k gemma-3-270m-f32-self smollm2-135m-instruct-hermes

.PHONY: setup models browser run test native-check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# specgen.llama.build is stdlib-only: it picks CMake flags for this host, builds llama-cpp-python once per
# flag set (cached under ~/.cache/specgen/wheels) and installs it; then specgen itself.
setup: $(BIN)/python
	$(BIN)/python -m specgen.llama.build
	$(BIN)/python -m pip install -q -e '.[test]'

models: setup
	$(BIN)/specgen models pull $(TEST_MODELS)

# The pair in configs/default.yaml, pulled as part of set-up so that the demo itself is quick.
DEMO_MODELS := gemma-3-270m-f32 gemma-3-270m-q2_k

run: setup
	$(BIN)/specgen models pull $(DEMO_MODELS)
	$(BIN)/specgen demo

# The page's test (tests/test_serve_page.py) drives Debian's chromium through chromedriver: installed
# here (Debian, as root) unless both are already on PATH.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; }

test: models browser
	SPECGEN_REQUIRE_INVARIANT=1 $(BIN)/python -m pytest -q --durations=15

# specgen's C++ (specgen/llama/native/*.h) compiled header by header, each alone, for AVX2 and AVX-512,
# against the pinned llama.cpp's headers; and its patches (specgen/llama/patches/) applied to that llama.cpp.
# Quick (seconds): no llama.cpp build, no model.
native-check: $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/test_native_headers.py tests/test_packed_kernel.py

clean:
	rm -rf $(VENV) *.egg-info
