"""What several benchmark commands share; nothing here is run on its own.

datasets.py (what each request sends), backends.py (HTTP or the native client), load_run.py (one
run's arrivals, concurrency and timings) and load_summary.py (the figures, table and plots) make
the load generator of `benchmarks.load`, which `benchmarks.fault_drill` drives too; processes.py
reads a server's processes from /proc for `benchmarks.fault_drill` and `benchmarks.soak`.
"""
