# Entry points: `make test` and `make book`. The first call creates .venv and installs
# everything; later calls reuse it (reinstalling when pyproject.toml changes).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PROFILE ?= evidence
JOBS ?= 2

# Data root: FEDLIB_DATA if set; else ../shared/datasets when that folder exists.
SHARED := $(wildcard ../shared/datasets)
ifneq ($(SHARED),)
export FEDLIB_DATA ?= $(abspath $(SHARED))
endif

.PHONY: test book explore results demo bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.test-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	touch $@

$(VENV)/.book-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test,book]'
	touch $@ $(VENV)/.test-installed

test: $(VENV)/.book-installed
	$(BIN)/python -m pytest

book: $(VENV)/.book-installed
	$(BIN)/python -m fedlib book --profile $(PROFILE) --jobs $(JOBS)

# The live explorer in a browser (Voila on localhost; prints the URL)
explore: $(VENV)/.book-installed
	$(BIN)/python -m fedlib explore

# Full-protocol runs kept in the repository (the results queue, fedlib/app/queue.py):
#   make results                         every chapter, most valuable run first
#   make results CHAPTER=fedavg PROFILE=paper BUDGET=3600 WORKERS=2 QUEUE_ARGS=--cpu-only
#   make results QUEUE_ARGS=--list       what is stored, what is pending, what each costs
results: $(VENV)/.test-installed
	$(BIN)/python -m fedlib results $(if $(CHAPTER),--chapter $(CHAPTER)) --profile $(if $(filter command line environment,$(origin PROFILE)),$(PROFILE),paper) $(if $(BUDGET),--budget $(BUDGET)) $(if $(WORKERS),--workers $(WORKERS)) $(QUEUE_ARGS)

demo: $(VENV)/.test-installed
	$(BIN)/python -m fedlib run examples/fedavg_fmnist.yaml

bench: $(VENV)/.test-installed
	$(BIN)/python benchmarks/round_speed.py

clean:
	rm -rf $(VENV) .pytest_cache
