# The workbook's commands. Each target sets up the project's virtual environment first
# (created if missing, reinstalled when pyproject.toml is newer than it).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PROFILE ?= default
ARGS ?=

.PHONY: venv figures smoke test lab bench clean-runs

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[test]"
	$(PY) -m replication install-model
	touch $(STAMP)

## figures: execute every notebook (default profile), regenerate figures/ and runs/default/report/
figures: $(STAMP)
	$(PY) -m replication run --profile $(PROFILE) $(ARGS)

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

clean-runs:
	rm -rf runs/
