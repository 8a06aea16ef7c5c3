"""The Spark application as a script, for `spark-submit` (which runs a file, not `-m`):
the chart's driver pod runs `spark-submit --master k8s://... /opt/dwell/spark/launch.py`.
Locally `python -m dwell_spark` does the same."""

import sys

from dwell_spark.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
