# kdist_magics: `make lab` and `make test` do all set-up on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
COLAB_VENV ?= .venv-colab
# What also runs on Colab's own stack (.venv-colab): everything but Horovod (Colab has none), Ray
# (the ray extra is not on Colab's stack; the Ray tier runs after the Colab part, in .venv),
# the JupyterLab browser tests (Colab's front end is Notebook 6: the classic test runs instead),
# network namespaces and the pinned-stack installs (both are about this machine, not the stack),
# PyTorch (Colab's torch comes from its own wheel index, not from its published freeze), and the
# GPU check's dry run (a script for the lent GPU machine, whose stack is not Colab's), the docs
# build (its packages are the docs extra, in .venv only), the Slurm cluster (this machine's),
# the tests about an environment without TensorFlow (tfless) and the TensorFlow-free ones (notf):
# .venv-colab-tpu runs those on the same JAX, Keras, NumPy and ipykernel pins as Colab's
# (0.7.2, 3.13.2, 2.1.3, 6.17.1), and the main suite runs them with TensorFlow installed.
COLAB_TESTS ?= (not horovod and not torch and not ray and not netns and not slurm and not browser and not stacks and not long and not gpucheck and not docs and not tfless and not notf and not anystack) or classic

.PHONY: setup lab test test-fast test-quick docs demo bench clean

# TORCH=1 also installs PyTorch (the CUDA build pip gives by default is ~5 GB; make test always does);
# RAY=1 installs Ray (the ray extra: --launcher ray, notebook 11)
setup:
	@bash scripts/setup.sh $(if $(filter 1,$(TORCH)),--torch) $(if $(filter 1,$(RAY)),--ray)

# Loopback only; as root (containers, CI boxes) Jupyter needs --allow-root to start at all.
lab: setup
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks --ServerApp.ip=127.0.0.1 $(LAB_ARGS) \
	  $(if $(filter 0,$(shell id -u)),--allow-root)

# The whole suite on the current stack (.venv, Horovod required), then again on Colab's pins.
# .venv-colab is set up beside the main suite, and the long tier (fault matrix, soaks) runs beside
# the Colab part (scripts/test.sh says why that is safe); the docs are built once, after the main suite
# has executed the notebooks, so the tutorials show this run's outputs (tests/test_docs.py, marker
# docs: warnings are errors, every internal reference checked). The account (time per step and
# tier, slowest tests, clusters started) is printed at the end and kept in test-output/.
test:
	@PYTEST_ARGS="$(PYTEST_ARGS)" COLAB_TESTS='$(COLAB_TESTS)' bash scripts/test.sh

FAST_TESTS := not kernel and not engines and not notebook and not browser and not classic and not netns and not slurm and not slow and not docs
# The fast tier: no TensorFlow, no engines; under a minute.
test-fast: setup
	$(PY) -m pytest -m "$(FAST_TESTS)" $(PYTEST_ARGS)

# A developer's loop: the fast tier plus one real run per strategy (tests marked quick); minutes.
test-quick:
	@bash scripts/setup.sh --torch --ray
	$(PY) -m pytest -m "($(FAST_TESTS)) or quick" $(PYTEST_ARGS)

# The documentation site, offline, into docs/_build/html: Sphinx, warnings as errors, every
# internal reference and link checked (-n); the tutorials show the notebooks as make test last
# executed them (test-output/notebooks/); nothing is executed or downloaded. A few seconds.
docs: setup
	$(PY) -m sphinx -b html -W --keep-going -n -q docs docs/_build/html $(DOCS_ARGS)

demo: setup
	@$(PY) scripts/demo.py

bench: setup
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) $(COLAB_VENV) .venv-colab-tpu .pytest_cache test-output demo-output
