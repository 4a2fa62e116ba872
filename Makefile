# The whole set-up: `make run` and `make test` work from a fresh clone with only Python and make.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test bench device-check lint clean

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

# On a lent GPU machine (python3 with CUDA JAX, no network; no venv needed), at most 8 minutes:
# make device-check OUT=dir [ARGS=--quick] [PYTHON=...]. See experiments/README.md, Device check.
device-check:
	$(if $(OUT),,$(error device-check writes to OUT=dir))
	PYTHON=$(PYTHON) bash experiments/device_check.sh $(OUT) $(ARGS)

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) build *.egg-info runs
