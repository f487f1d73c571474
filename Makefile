# The README's two commands: `make demo` and `make test`. Both create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup demo test lint clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Install the local CPU build of torch first when none is present (a bare `torch` requirement would
# pull gigabytes of CUDA packages); a torch that is already installed is kept.
setup: $(BIN)/python
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[test]"

demo: setup
	$(BIN)/densitas demo

test: setup
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/python -m pytest -n 2 -q
	$(BIN)/python -m pytest -q -p no:cacheprovider --doctest-modules src

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
