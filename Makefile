# One command sets up an environment and runs the suite on a fresh machine: `make test`.
# One command trains OBLR-PO on the built-in task and tiny model:         `make demo`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup test demo clean

$(BIN)/oblr: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned, so that a CPU build from the local wheel is used rather than a CUDA download
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev]"
	touch $(BIN)/oblr

setup: $(BIN)/oblr

test: setup
	$(BIN)/python -m pytest tests

demo: setup
	$(BIN)/oblr train

clean:
	rm -rf $(VENV) runs
