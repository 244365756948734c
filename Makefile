# make train: venv + install + built-in data + the tiny model through the real launcher.
# make test:  venv + install with dev extras + the whole test suite.
# make test-gpu: the GPU tier (pytest -m gpu) with the Python already set up on a GPU machine.
# make gpu-wheels: DeepSpeed and what it needs, as wheels for a GPU machine without them
#                  (bench/gpu_checks.sh installs them there and runs the GPU checks).
# torch is pinned to the 2.13.0 CPU build through a constraints file that every pip call
# (and every build environment) sees, so nothing can pull another torch or CUDA packages.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CONSTRAINT := $(CURDIR)/requirements/constraints.txt
PIP := PIP_CONSTRAINT=$(CONSTRAINT) $(PY) -m pip
REQS := $(wildcard requirements/*.txt) setup.py
PYTEST_ARGS ?=

.PHONY: venv install install-dev check-install data train test test-gpu gpu-wheels bench clean-data

venv:
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(REQS) | venv
	$(PIP) install -q torch==2.13.0 setuptools wheel
	$(PIP) install -q --no-build-isolation -e ".[tensorboard,wandb]"
	@$(MAKE) --no-print-directory check-install
	@touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP) install -q --no-build-isolation -e ".[dev,tensorboard,wandb,comet,hf,eval,mpi,plot]"
	@$(MAKE) --no-print-directory check-install
	@touch $@

install: $(VENV)/.installed

install-dev: $(VENV)/.installed-dev

check-install:
	@$(PY) -m pip list 2>/dev/null | grep -i nvidia && { echo "CUDA packages were installed; remove them: only the torch 2.13.0 CPU build is expected" >&2; exit 1; } || true
	@$(PY) -c "import torch, sys; v = torch.__version__.split('+')[0]; sys.exit(0 if v == '2.13.0' else 'torch ' + torch.__version__ + ' is installed; this project pins 2.13.0')"

data: install
	$(PY) tools/datasets/prepare_data.py builtin -d data

train: install data
	$(PY) deepy.py train.py configs/tiny.yml

# --durations: the slowest tests are listed at the end, to keep the suite's time in view.
# tmp_path_retention_count=1: a run's temporary directories (several GB: datasets, checkpoints)
# are kept until the next run, not for the last three (pytest's default), which fills disks.
test: install-dev
	$(PY) -m pytest -q --durations=25 -o tmp_path_retention_count=1 $(PYTEST_ARGS) tests

# The GPU tier: tests marked gpu, on the CUDA device DeepSpeed finds (skipped without one).
test-gpu:
	DS_ACCELERATOR=cuda $(PY) -m pytest -q -m gpu $(PYTEST_ARGS) tests

# This venv's DeepSpeed built without its C++ ops (they JIT-build where needed), plus the
# packages DeepSpeed needs that a Python with torch, triton and transformers may lack, in this
# venv's versions, for GPU_PYTHON (the GPU machine's Python), into .whl/ (git-ignored).
GPU_PYTHON ?= 3.12
GPU_WHEEL_PACKAGES := hjson pydantic pydantic_core annotated_types typing_inspection typing_extensions
gpu-wheels: install
	rm -rf .whl && mkdir -p .whl
	DS_BUILD_OPS=0 $(PIP) wheel -q --no-deps --no-build-isolation -w .whl \
		deepspeed==$$($(PY) -c "from importlib.metadata import version; print(version('deepspeed'))")
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version $(GPU_PYTHON) \
		--implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
		$$($(PY) -c "from importlib.metadata import version; print(*(p + '==' + version(p) for p in '$(GPU_WHEEL_PACKAGES)'.split()))")
	git rev-parse HEAD > .whl/commit
	@ls .whl

bench: install-dev
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean-data:
	rm -rf data/builtin
