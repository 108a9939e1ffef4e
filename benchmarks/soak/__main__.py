"""`python -m benchmarks.soak`: the soak of benchmarks/soak/run.py; exit status 1 when a target is missed."""

import sys

from benchmarks.soak.run import main

sys.exit(0 if main()["passed"] else 1)
