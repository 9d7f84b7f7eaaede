# One command each: `make dev` runs the whole system, `make test` installs and tests it.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv dev test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,embedded]'
	touch $(STAMP)

venv: $(STAMP)

dev: $(STAMP)
	$(VENV)/bin/sftq dev

test: $(STAMP)
	$(PY) tests/run.py

lint: $(STAMP)
	$(VENV)/bin/ruff check functions clients tests bench
	$(VENV)/bin/mypy functions/sftq_server clients/sftq_client

bench: $(STAMP)
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) .sftq
