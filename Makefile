# Two commands on a fresh machine:  `make run` (set up, fetch SmolLM2, open the window)
# and `make test` (set up, fetch SmolLM2, lint, run the whole test suite). Both are idempotent.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Installed only when the venv has no torch yet: the CPU wheel here; a GPU user can pass
# TORCH='torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128' or reuse their own.
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.kvinspect-installed
PYTEST_ARGS ?=
COMPAT_VENV ?= .venv-tf456
COMPAT_TRANSFORMERS ?= transformers==4.56.2

.PHONY: setup run fetch lint test test-xvfb test-compat screenshot bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

fetch: setup
	$(VENV)/bin/kvinspect models fetch smollm2

run: fetch
	$(VENV)/bin/kvinspect --model smollm2

# The architecture gates (docs/gates.md): style and imports, the import contracts, the core's types.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy kvinspect/core

test: fetch lint
	QT_QPA_PLATFORM=offscreen KVINSPECT_REQUIRE_SMOLLM2=1 $(PY) -m pytest -q -p no:xvfb $(PYTEST_ARGS)

# The GUI tests again on a real X server (pytest-xvfb starts Xvfb); asserts the xcb plugin loaded.
test-xvfb: setup
	env -u QT_QPA_PLATFORM KVINSPECT_EXPECT_PLATFORM=xcb $(PY) -m pytest -q tests/gui $(PYTEST_ARGS)

# The core tests against the oldest supported transformers, in its own venv (its hub pin differs).
$(COMPAT_VENV)/.installed: pyproject.toml
	test -x $(COMPAT_VENV)/bin/python || $(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/python -c "import torch" 2>/dev/null || $(COMPAT_VENV)/bin/python -m pip install -q $(TORCH)
	$(COMPAT_VENV)/bin/python -m pip install -q '$(COMPAT_TRANSFORMERS)' numpy psutil platformdirs gguf accelerate pytest pytest-timeout
	$(COMPAT_VENV)/bin/python -m pip install -q --no-deps -e .
	touch $@

test-compat: $(COMPAT_VENV)/.installed fetch
	KVINSPECT_REQUIRE_SMOLLM2=1 $(COMPAT_VENV)/bin/python -m pytest -q -p no:qt -p no:xvfb -m "not e2e" tests/core $(PYTEST_ARGS)

screenshot: fetch
	QT_QPA_PLATFORM=offscreen $(VENV)/bin/kvinspect gui --model tiny-gemma3 --script resources/scripts/demo.json \
		--screenshot artifacts/window.png --exit-when-done

# Figures, not assertions (README: Tests and CI). The last three need SmolLM2 and Xvfb (apt-get install xvfb).
bench: fetch
	$(PY) benchmarks/observer_overhead.py
	$(PY) benchmarks/trace_size.py
	$(PY) benchmarks/window_vs_cli.py
	$(PY) benchmarks/heartbeat.py
	$(PY) benchmarks/engine_start.py

clean:
	rm -rf $(VENV) $(COMPAT_VENV) build *.egg-info
