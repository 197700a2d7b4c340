# kdist_magics: `make lab` and `make test` do all set-up on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: setup lab test test-fast demo bench clean

setup:
	@bash scripts/setup.sh

# Loopback only; as root (containers, CI boxes) Jupyter needs --allow-root to start at all.
lab: setup
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks --ServerApp.ip=127.0.0.1 $(LAB_ARGS) \
	  $(if $(filter 0,$(shell id -u)),--allow-root)

test:
	@bash scripts/setup.sh --browser
	$(PY) -m pytest $(PYTEST_ARGS)

# The fast tier: no TensorFlow, no engines; seconds.
test-fast: setup
	$(PY) -m pytest -m "not kernel and not engines and not notebook and not browser and not netns and not slow" $(PYTEST_ARGS)

demo: setup
	@$(PY) scripts/demo.py

bench: setup
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache test-output demo-output
