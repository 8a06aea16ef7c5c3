"""dwell-client on Python 3.9 to 3.13 (dwell_dev.client_matrix) against this package's
delivery stack: per version a fresh virtualenv with the built wheel (the sdist on 3.9), one
message published with a delay, received on time, nacked and received again, and the
client's unit tests; and what the client's install brings next to the services' full
install."""

from __future__ import annotations

import shutil
from pathlib import Path

from dwell_dev import client_matrix

from .conftest import SPARK_MARGIN_MS, Dwell, redelivery_margin_ms, warm_redelivery_path

# Dependencies of the services that an application installing dwell-client must not get.
SERVICES_ONLY = {"fastapi", "uvicorn", "redis", "numpy", "pyroaring", "msgspec", "orjson",
                 "prometheus-client"}


def test_the_client_works_on_every_python_it_supports(e2e: Dwell, tmp_path: Path) -> None:
    # The first redeliveries of a cold Spark app take several backoff batches longer.
    warm_redelivery_path(e2e)
    stack = client_matrix.Endpoints(e2e.policy, e2e.admission, e2e.tracker, e2e.bootstrap)
    work = tmp_path / "matrix"
    report = client_matrix.run(
        stack, work, sizes=True,
        # Pulsar's 1 s beyond deliverAt + tickTime, and the drain's trigger and round.
        late_ms=1000 + SPARK_MARGIN_MS,
        redelivery_late_ms=redelivery_margin_ms(client_matrix.NACK_DELAY_MS))
    print(report.table(), report.sizes_table(), sep="\n\n")
    if report.ok:
        shutil.rmtree(work)  # six virtualenvs, ~500 MB; the logs of a failure stay
    assert [(r.version, r.source) for r in report.rows] == [
        (v, "sdist" if v == "3.9" else "wheel") for v in ("3.9", "3.10", "3.11", "3.12", "3.13")]
    for row in report.rows:
        assert row.interpreter.startswith(f"{row.version}."), row.interpreter
        assert row.ok, f"Python {row.version}:\n{report.table()}"
    client = {p.name for p in report.client_install()}
    full = {p.name for p in report.full_install or []}
    assert "dwell-client" in client and "confluent-kafka" in client
    assert not SERVICES_ONLY - full, SERVICES_ONLY - full
    assert not client & SERVICES_ONLY, client & SERVICES_ONLY
    # The admin extra (dwell-admin) is not part of the bare install either.
    assert not client & {"typer", "rich", "cryptography"}
