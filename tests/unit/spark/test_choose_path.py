"""Which copy path a drain round takes (dwell_spark.drain.choose_path), without Spark."""

from __future__ import annotations

from pyroaring import BitMap64

from dwell.core import topics as names
from dwell_spark.drain import choose_path
from dwell_spark.records import Range
from dwell_spark.settings import SparkSettings

DENSE = [Range("ready", names.DELAYED, 0, 0, 199_999)]
SCATTERED = [Range("ready", names.DELAYED, 0, 0, 999_999,
                   offsets=BitMap64(range(0, 1_000_000, 5)))]
REDELIVERY = [Range("ready-s-RETRY", "ready", 0, 0, 199_999, "s", {})]


def settings(**kw: object) -> SparkSettings:
    return SparkSettings(**{"drain_local_max_records": 100_000, **kw})


def test_by_default_the_driver_takes_rounds_up_to_50k_records() -> None:
    assert SparkSettings().drain_local_max_records == 50_000


def test_rounds_up_to_the_local_limit_stay_on_the_driver() -> None:
    small = [Range("ready", names.DELAYED, 0, 0, 99_999)]
    assert choose_path(settings(), small) == "driver"


def test_larger_rounds_run_as_python_copies_in_spark_tasks() -> None:
    for ranges in (DENSE, SCATTERED, REDELIVERY):
        assert choose_path(settings(), ranges) == "tasks"
