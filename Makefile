# The whole set-up: `make run` and `make test` work from a fresh clone with only Python and make.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test test-slow bench device-check lint clean

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

# The suite over every core (pytest-xdist), in two parts: `make test` leaves out the tests marked
# slow (statistics over many draws, runs in several processes), `make test-slow` runs only those.
# PYTEST_ARGS narrows either: make test PYTEST_ARGS="tests/test_config.py -k toml".
test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -n auto -m "not slow" $(PYTEST_ARGS)

test-slow: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -n auto -m slow $(PYTEST_ARGS)

bench: $(VENV)/.installed
	$(BIN)/python experiments/bench_throughput.py $(ARGS)

# On a lent GPU machine (python3 with CUDA JAX, no network; no venv needed), at most 9 min 20 s:
# make device-check OUT=dir [ARGS=--quick] [PYTHON=...]. See experiments/README.md, Device check.
device-check:
	$(if $(OUT),,$(error device-check writes to OUT=dir))
	PYTHON=$(PYTHON) bash experiments/device_check.sh $(OUT) $(ARGS)

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) build *.egg-info runs
