"""The soak (`python -m benchmarks.soak`): a long mixed load against a whole server; nothing may leak.

run.py drives it and judges the targets; workload.py makes the calls, calls.py fires one and judges
what comes back, server.py starts the server under test and reads its processes and pages.
"""
