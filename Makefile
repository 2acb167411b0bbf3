# Two commands on a fresh machine (Python, pip and a C++ compiler):
#   make demo   install into a local venv and run the main job
#   make test   install and run the test suite
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The lint tools of the [dev] extra (pyproject.toml), without the package itself.
LINT_TOOLS = $(shell $(PY) -c "import tomllib; d = tomllib.load(open('pyproject.toml', 'rb')); \
  print(' '.join(repr(r) for r in d['project']['optional-dependencies']['dev'] \
  if not r.startswith('jax_rccl')))")
# UCX's headers for the UCX network backend (the [ucx] extra of pyproject.toml, which the [test]
# extra installs too): before the build, so that the first build has the backend.
UCX_WHEEL = $(shell $(PY) -c "import tomllib; d = tomllib.load(open('pyproject.toml', 'rb')); \
  print(d['project']['optional-dependencies']['ucx'][0])")
CXX_SOURCES := $(shell git ls-files 'ffi/*.h' 'ffi/*.cc' 'hip/*.h' 'hip/*.hip' 2>/dev/null)

.PHONY: demo test install lint bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# Build dependencies go into the venv first so the build reuses them (no second jax download);
# scikit-build-core keeps its build folder, so a second install rebuilds only what changed. The
# compile steps show as they go ("[k/n] ..."); the whole log is in build/install.log.
install: $(PY)
	$(PY) -m pip install -q "jax>=0.10.2,<0.12" "nanobind>=2.0" "scikit-build-core>=0.10" \
	  "$(UCX_WHEEL)"
	@mkdir -p build
	@echo "building and installing jax_rccl (a first build takes a few minutes on 2 cores)"
	@$(PY) -m pip install -v --no-build-isolation ".[test]" 2>&1 | tee build/install.log | \
	  grep --line-buffered -E '^ *\[[0-9]+/[0-9]+\] ' | sed -u 's/^ *//; s/ -o .*//' | cut -c1-100; \
	  rc=$${PIPESTATUS[0]}; if [ $$rc -ne 0 ]; then tail -n 40 build/install.log; \
	  echo "make install failed (exit $$rc); the whole log: build/install.log"; exit $$rc; fi

demo: install
	$(PY) -P -m jax_rccl.demo

test: install
	$(VENV)/bin/pytest -q --durations=20 tests

# Needs only the venv and the lint tools, not the built extension.
lint: $(PY)
	$(PY) -m pip install -q $(LINT_TOOLS)
	$(VENV)/bin/ruff check jax_rccl jax_rccl_plugin tests benchmarks tools
	$(VENV)/bin/ruff format --check jax_rccl jax_rccl_plugin tests benchmarks tools
	$(VENV)/bin/clang-format --dry-run --Werror $(CXX_SOURCES)

bench: install
	$(PY) -P benchmarks/planner.py

clean:
	rm -rf build $(VENV)
