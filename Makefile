# kdist_magics: `make lab` and `make test` do all set-up on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
COLAB_VENV ?= .venv-colab
# What also runs on Colab's own stack (.venv-colab): everything but Horovod (Colab has none),
# the JupyterLab browser tests (Colab's front end is Notebook 6: the classic test runs instead),
# network namespaces and the pinned-stack installs (both are about this machine, not the stack),
# PyTorch (Colab's torch comes from its own wheel index, not from its published freeze), and the
# GPU check's dry run (a script for the lent GPU machine, whose stack is not Colab's).
COLAB_TESTS ?= (not horovod and not torch and not netns and not slurm and not browser and not stacks and not long and not gpucheck) or classic

.PHONY: setup lab test test-fast demo bench clean

# TORCH=1 also installs PyTorch (the CUDA build pip gives by default is ~5 GB; make test always does)
setup:
	@bash scripts/setup.sh $(if $(filter 1,$(TORCH)),--torch)

# Loopback only; as root (containers, CI boxes) Jupyter needs --allow-root to start at all.
lab: setup
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks --ServerApp.ip=127.0.0.1 $(LAB_ARGS) \
	  $(if $(filter 0,$(shell id -u)),--allow-root)

# The whole suite on the current stack (.venv, Horovod required), then again on Colab's pins.
test:
	@KDIST_REQUIRE_HOROVOD=1 bash scripts/setup.sh --browser --torch
	$(PY) -m pytest -m "not classic" $(PYTEST_ARGS)
	@bash scripts/setup.sh --env colab
	KDIST_TEST_OUTPUT=test-output/colab $(COLAB_VENV)/bin/python -m pytest -m "$(COLAB_TESTS)" $(PYTEST_ARGS)

# The fast tier: no TensorFlow, no engines; seconds.
test-fast: setup
	$(PY) -m pytest -m "not kernel and not engines and not notebook and not browser and not classic and not netns and not slurm and not slow" $(PYTEST_ARGS)

demo: setup
	@$(PY) scripts/demo.py

bench: setup
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) $(COLAB_VENV) .pytest_cache test-output demo-output
