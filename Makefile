# One command each: `make dev` runs the whole system, `make test` installs and tests it.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv dev test lint bench clean

# Silent (@) and onto stderr: `make dev`'s stdout is sftq dev's KEY=value lines and `ready`
# only (docs/dev.md), even on the first run, when the venv is made and installed.
$(STAMP): pyproject.toml
	@echo "making $(VENV) and installing the project into it (once)" >&2
	@$(PYTHON) -m venv $(VENV) >&2
	@$(PY) -m pip install -q --upgrade pip >&2
	@$(PY) -m pip install -q -e '.[dev,embedded]' >&2
	@touch $(STAMP)

venv: $(STAMP)

dev: $(STAMP)
	@$(VENV)/bin/sftq dev

test: $(STAMP)
	$(PY) tests/run.py

lint: $(STAMP)
	$(VENV)/bin/ruff check functions clients tests bench
	$(VENV)/bin/mypy functions/sftq_server clients/sftq_client
	PYTHONPATH=functions:clients $(VENV)/bin/lint-imports

# wrk drives the HTTP load (a Python generator would take CPU from the server it measures);
# as root on Debian it is installed here, elsewhere the run says its HTTP ratios are not comparable.
bench: $(STAMP)
	@command -v wrk >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	  && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends wrk >/dev/null; } \
	  || echo "wrk is not installed (apt-get install wrk): HTTP ratios will be marked not comparable"
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) .sftq
