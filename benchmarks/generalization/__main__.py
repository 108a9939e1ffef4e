"""`python -m benchmarks.generalization`: the matrix of benchmarks/generalization/matrix.py; exit status 1
when a cell failed."""

from benchmarks.generalization.matrix import main

raise SystemExit(main())
