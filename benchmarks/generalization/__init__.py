"""The functional generalization matrix (`python -m benchmarks.generalization`): a correctness harness
that tests/test_generalization.py runs on the CPU and `--subset full` runs on a GPU.

matrix.py launches each server configuration and runs its cells; the cells are in reference_cells.py
(what every other server must reproduce) and layout_cells.py (prefix cache, chunked prefill,
preemption, async scheduling, DP, TP), built on cell.py's Cell and checks; workload.py makes the
prompts, server.py runs one configuration and checks its pool balances, compare.py says when two
runs agree, report.py writes the Markdown (`python -m benchmarks.generalization.report`).
"""
