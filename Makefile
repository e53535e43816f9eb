# The whole setup on a fresh machine is one of these two targets.
#   make run                  CPU build of llama.cpp, then the TUI
#   make run CUDA_ARCH=121a   CUDA build for a DGX Spark (90 for an H200)
#   make test                 the test suite (what CI runs): lint, format, types, then pytest
#   make check                lint, format and types only (needs the .venv a bootstrap made)
CUDA_ARCH ?=
PYTEST_ARGS ?=
PY_DIRS = app engine kernels store tests benchmarks devkit

.PHONY: run test bootstrap check typecheck

bootstrap:
	CUDA_ARCH="$(CUDA_ARCH)" packaging/bootstrap.sh

run: bootstrap
	.venv/bin/velo-chat

test: bootstrap
	$(MAKE) --no-print-directory check
	.venv/bin/python -m pytest -q $(PYTEST_ARGS)

check:
	.venv/bin/ruff check $(PY_DIRS)
	.venv/bin/ruff format --check $(PY_DIRS)
	$(MAKE) --no-print-directory typecheck

# mypy checks the installed layout (velo_chat.app is app/, ...; see [tool.mypy] in
# pyproject.toml): link the top-level folders into build/typecheck/velo_chat first.
typecheck:
	@mkdir -p build/typecheck/velo_chat
	@for d in app engine kernels store assets; do ln -sfn ../../../$$d build/typecheck/velo_chat/$$d; done
	.venv/bin/mypy
