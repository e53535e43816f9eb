# The whole setup on a fresh machine is one of these two targets.
#   make run                  CPU build of llama.cpp, then the TUI
#   make run CUDA_ARCH=121a   CUDA build for a DGX Spark (90 for an H200)
#   make test                 the test suite (what CI runs)
CUDA_ARCH ?=
PYTEST_ARGS ?=

.PHONY: run test bootstrap

bootstrap:
	CUDA_ARCH="$(CUDA_ARCH)" packaging/bootstrap.sh

run: bootstrap
	.venv/bin/velo-chat

test: bootstrap
	.venv/bin/ruff check app engine kernels store tests benchmarks
	.venv/bin/python -m pytest -q $(PYTEST_ARGS)
