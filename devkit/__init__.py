"""Development tools shared by the tests and the benchmarks; not part of the shipped package.

Importable from the repository root (pytest runs with `pythonpath = ["."]`; the benchmark
scripts put the root on their path): model and table generators (the tiny qwen4exp, its PLE
tables, split and re-templated GGUF copies), the test-data cache, numpy references for the PLE
kernels, stand-ins for the speculation stepper's live sequence, and the scripted engine that
feeds the TUI's layout and flow tests and `benchmarks/tui_update_cost.py` (`fake_engine.py`).
`tests/support` keeps what only the tests use; nothing here imports `tests` or `benchmarks`.
"""
