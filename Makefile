# The workbook's commands. Each target sets up the project's virtual environment first: created if missing with
# $(PYTHON) (3.11, 3.12 or 3.13: `make PYTHON=python3.12 ...`), filled from requirements.lock (every package of
# the tree, pinned) and reinstalled when pyproject.toml or the lock is newer than it. pip shows its progress.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LOCK := requirements.lock
PIP := $(PY) -m pip install --disable-pip-version-check
PROFILE ?= default
ARGS ?=
# Packages that only PyPI's CUDA build of torch needs: left out of the lock, which pins the CPU tree the workbook
# runs on (a GPU machine's torch brings them at the versions it pins itself).
CUDA_ONLY := cuda-bindings cuda-pathfinder cuda-toolkit nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc \
	nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse \
	nvidia-cusparselt-cu13 nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx triton

.PHONY: venv figures retrain smoke test lab bench lock clean-runs

venv: $(STAMP)

$(STAMP): pyproject.toml $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) -r $(LOCK)
	$(PIP) --no-deps -e .
	$(PY) -m replication install-model
	touch $(STAMP)

## figures: execute every notebook (default profile) from the committed results store (results/default/), regenerate
## figures/ and runs/default/report/; what the store lacks is made now
figures: $(STAMP)
	$(PY) -m replication run --profile $(PROFILE) $(ARGS)

## retrain: the same, every result made from scratch (CPU hours); `make retrain ARGS="--only 03"` one notebook
retrain: $(STAMP)
	$(PY) -m replication run --profile $(PROFILE) --retrain $(ARGS)

## smoke: the same, with the tiny smoke profile (outputs under runs/smoke/)
smoke: $(STAMP)
	$(PY) -m replication run --profile smoke $(ARGS)

## test: the test suite, including a smoke execution of every notebook
test: $(STAMP)
	$(PY) -m pytest $(ARGS)

## lab: JupyterLab with the project's environment as the python3 kernel
lab: $(STAMP)
	$(PY) -m jupyter lab notebooks/

## bench: training benchmark (ours vs TRL), prints the ratio
bench: $(STAMP)
	$(PY) -m replication bench grpo $(ARGS)

## lock: resolve requirements.lock again from pyproject.toml's pins, for Python 3.11-3.13 (needs uv: pip install uv)
lock:
	uv pip compile pyproject.toml --extra test --extra scale --universal --python-version 3.11 \
		$(addprefix --no-emit-package ,$(CUDA_ONLY)) -o $(LOCK)

clean-runs:
	rm -rf runs/
