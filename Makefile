# The README's commands. Each target installs what it needs first, so it works on a fresh machine
# (inside the virtual environment the README creates first).
PYTHON ?= python3
PIP := $(PYTHON) -m pip
# torch first, pinned to the CPU build that lies on these machines' disk, so that the project's
# own `torch>=2.5` requirement is already satisfied and pip does not pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: install install-test test lint

# What serving needs, nothing more.
install:
	$(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -e .

# The test extra besides: pytest, ruff, import-linter, triton (kernels under its interpreter),
# hypothesis, the SGLang Model Gateway and the openai and anthropic clients.
install-test: install
	$(PIP) install -q -e ".[test]"

lint: install-test
	$(PYTHON) -m ruff check .
	lint-imports

test: lint
	$(PYTHON) -m pytest tests
