# The README's commands. Each target installs what it needs first, so it works on a fresh machine.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
# torch first, pinned to the CPU build that lies on these machines' disk, so that the project's
# own `torch>=2.5` requirement is already satisfied and pip does not pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: install test lint

install:
	$(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -e ".[test]"

lint:
	$(PYTHON) -m ruff check .
	lint-imports

test: install lint
	$(PYTHON) -m pytest tests
