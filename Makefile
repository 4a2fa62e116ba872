# The whole set-up: `make run` and `make test` work from a fresh clone with only Python and make.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test bench lint clean

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/activate
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/activate
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(VENV)/.installed $@

run: $(VENV)/.installed
	$(BIN)/fedjax-het run $(ARGS)

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: $(VENV)/.installed
	$(BIN)/python experiments/bench_throughput.py $(ARGS)

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) build *.egg-info runs
