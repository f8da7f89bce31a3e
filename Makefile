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
# The suite on pytest-xdist workers, one torch thread each (two jobs' torch threads on two cores wait on
# each other at every op). Measured on this 2-core machine: `make test`'s pytest 519 s serial, 322 s on two
# workers. TEST_JOBS=0 runs it in one process.
TEST_JOBS ?= auto
XDIST = $(if $(filter 0,$(TEST_JOBS)),,-n $(TEST_JOBS) --maxprocesses=4 --dist worksteal)
XDIST_ENV = $(if $(filter 0,$(TEST_JOBS)),,OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1})
COMPAT_VENV ?= .venv-tf456
COMPAT_TRANSFORMERS ?= transformers==4.56.2

.PHONY: setup run fetch lint test test-xvfb test-compat test-compare-env test-compiled screenshot bench clean fuzz

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

# gemma3-270m (the hybrid demo, ~240 MB + a 1.1 GB conversion on first load) is opt-in:
# `make fetch FETCH_MODELS="smollm2 gemma3-270m"`; its tests skip without it (KVINSPECT_REQUIRE_GEMMA3=1 fails instead).
FETCH_MODELS ?= smollm2
fetch: setup
	for m in $(FETCH_MODELS); do $(VENV)/bin/kvinspect models fetch $$m || exit 1; done

run: fetch
	$(VENV)/bin/kvinspect --model smollm2

# The architecture gates (docs/gates.md): style and imports, the import contracts, the core's types.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy kvinspect/core

test: fetch lint
	QT_QPA_PLATFORM=offscreen KVINSPECT_REQUIRE_SMOLLM2=1 $(XDIST_ENV) \
		$(PY) -m pytest -q -p no:xvfb $(XDIST) $(PYTEST_ARGS)

# The GUI tests that draw, take input or time the UI, again on a real X server (pytest-xvfb starts
# Xvfb); asserts the xcb plugin loaded. Left out: tests of processes and files (engine death, ssh,
# follow) and of the image renderers, which always draw offscreen in a child (kvinspect/child_render.py).
XVFB_TESTS ?= tests/gui/windows/test_window_smoke.py tests/gui/windows/test_main_window.py \
	tests/gui/lanes/test_lanes_widget.py tests/gui/engine_link/test_stall.py tests/gui/windows/test_script_driver.py \
	tests/gui/windows/test_trace_modes.py tests/gui/dialogs/test_export_dialog.py tests/gui/panels/test_tokens_panel.py \
	tests/gui/windows/test_desktop_conventions.py tests/gui/base/test_qt_guard.py
test-xvfb: setup
	env -u QT_QPA_PLATFORM KVINSPECT_EXPECT_PLATFORM=xcb $(XDIST_ENV) $(PY) -m pytest -q $(XDIST) $(XVFB_TESTS) $(PYTEST_ARGS)

# The core tests against the oldest supported transformers, in its own venv (its hub pin differs).
$(COMPAT_VENV)/.installed: pyproject.toml
	test -x $(COMPAT_VENV)/bin/python || $(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/python -c "import torch" 2>/dev/null || $(COMPAT_VENV)/bin/python -m pip install -q $(TORCH)
	$(COMPAT_VENV)/bin/python -m pip install -q '$(COMPAT_TRANSFORMERS)' numpy psutil platformdirs gguf accelerate Pillow pytest pytest-timeout pytest-xdist
	$(COMPAT_VENV)/bin/python -m pip install -q --no-deps -e .
	touch $@

test-compat: $(COMPAT_VENV)/.installed fetch
	KVINSPECT_REQUIRE_SMOLLM2=1 $(XDIST_ENV) \
		$(COMPAT_VENV)/bin/python -m pytest -q -p no:qt -p no:xvfb -m "not e2e" $(XDIST) tests/core $(PYTEST_ARGS)

# One comparison across two environments (this venv and the compat venv), each configuration in its
# own engine child; both engines run this checkout (PYTHONPATH), whatever the compat venv holds.
test-compare-env: $(STAMP) $(COMPAT_VENV)/.installed fetch
	KVINSPECT_REQUIRE_SMOLLM2=1 KVINSPECT_COMPAT_PYTHON=$(CURDIR)/$(COMPAT_VENV)/bin/python PYTHONPATH=$(CURDIR) \
		$(PY) -m pytest -q -p no:qt -p no:xvfb tests/compare_env $(PYTEST_ARGS)

# Every built-in's forward compiled with fullgraph=True, plainly and under `kvinspect trace` (docs/observe.md);
# `make test` runs two of them. About 7 min a pass here.
test-compiled: setup
	KVINSPECT_COMPILED_SPECS=$$($(VENV)/bin/python -c "from kvinspect.core.model.catalog import BUILTINS; print(','.join(b.name for b in BUILTINS if not b.fetch))") \
		$(PY) -m pytest -q -p no:qt -p no:xvfb tests/core/observe/test_compiled.py -k fullgraph $(PYTEST_ARGS)

screenshot: fetch
	QT_QPA_PLATFORM=offscreen $(VENV)/bin/kvinspect gui --model tiny-gemma3 --script resources/scripts/demo.json \
		--screenshot artifacts/window.png --exit-when-done

# Hostile input, longer: the hypothesis suite at 20x its CI examples, then the seeded corpus over every
# command (docs/errors.md). `make test` runs the suite at CI size.
fuzz: setup
	QT_QPA_PLATFORM=offscreen KVINSPECT_FUZZ=fuzz $(PY) -m pytest -q -p no:xvfb tests/fuzz $(PYTEST_ARGS)
	$(PY) -m tests.fuzz.corpus

# Figures, not assertions (README: Tests and CI). The last three need SmolLM2 and Xvfb (apt-get install xvfb).
bench: fetch
	$(PY) benchmarks/observer_overhead.py
	$(PY) benchmarks/trace_size.py
	$(PY) benchmarks/window_vs_cli.py
	$(PY) benchmarks/heartbeat.py
	$(PY) benchmarks/engine_start.py

clean:
	rm -rf $(VENV) $(COMPAT_VENV) build *.egg-info

# -- Packaging (docs/packaging.md) ------------------------------------------------------
# `make wheel-smoke`: build the wheel and sdist, install the wheel into a fresh venv that cannot see
# the checkout, run the smoke test there. `make bundle`: the PyInstaller one-folder desktop bundle
# in dist/bundle/kvinspect and its smoke test (not in CI: see docs/packaging.md for the figures).
DIST ?= dist

.PHONY: wheel wheel-smoke uv-tool-smoke bundle desktop-validate

wheel: setup
	rm -f $(DIST)/kvinspect-*.whl $(DIST)/kvinspect-*.tar.gz
	$(PY) -m build --outdir $(DIST) .

wheel-smoke: wheel
	PYTHON=$(PYTHON) TORCH='$(TORCH)' bash packaging/smoke_wheel.sh $(DIST)

uv-tool-smoke: setup  # the wheel wheel-smoke built, or a new one
	ls $(DIST)/kvinspect-*.whl >/dev/null 2>&1 || $(MAKE) wheel
	PYTHON=$(PYTHON) bash packaging/smoke_uv_tool.sh $(DIST)

desktop-validate:
	desktop-file-validate packaging/kvinspect.desktop

bundle: setup
	$(PY) -c "import PyInstaller" 2>/dev/null || $(PY) -m pip install -q 'pyinstaller>=6.10'  # the bundle extra
	$(PY) -m PyInstaller --noconfirm --log-level WARN --distpath $(DIST)/bundle --workpath build/pyinstaller \
		packaging/kvinspect.spec
	bash packaging/smoke_bundle.sh $(DIST)/bundle/kvinspect
