"""`python -m playground.bench_history`, the path the README taught before the report moved
into `playground/report/` (issue 31): kept so that scripts written against it keep working.
The command is `playground.report.bench_history`."""

import sys

from playground.report.bench_history import main

if __name__ == "__main__":
    sys.exit(main())
