# The front door. Every target creates/uses .venv; nothing needs a hand-installed package.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: venv demo test bench proto proto-check lint run clean deploy-check

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

## make demo: a prefill node and a decode node exchanging a paged KV cache
demo: $(STAMP)
	$(PY) -m datadistd.demo

## make test: the whole test suite (unit, integration, reliability)
test: $(STAMP) proto-check
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -m bench

## make proto: regenerate the committed stubs from proto/datadist/v1/*.proto
proto: $(STAMP)
	$(PY) -m datadistd.tools.protogen --write

## make proto-check: fail when the committed stubs are stale
proto-check: $(STAMP)
	$(PY) -m datadistd.tools.protogen --check

lint: $(STAMP)
	$(PY) -m pip install --quiet ruff
	$(VENV)/bin/ruff check client server tests

run: $(STAMP)
	$(VENV)/bin/datadistd

clean:
	rm -rf $(VENV) build *.egg-info
