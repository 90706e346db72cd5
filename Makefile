# Shortcuts for graphkit development; the README's two commands are the reference.
VENV ?= .venv
PYTHON := $(VENV)/bin/python

.PHONY: setup dev test lint format

setup:  ## graphkit with the CLI and Hugging Face extras in .venv
	bash scripts/setup.sh

dev:  ## everything the tests, lint and notebooks need
	bash scripts/setup.sh --dev

test: dev
	$(PYTHON) -m pytest -q

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format:
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .
