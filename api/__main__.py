"""`python -m api serve ...`: the same as the `cadence` console script."""

from api.cli import main

raise SystemExit(main())
