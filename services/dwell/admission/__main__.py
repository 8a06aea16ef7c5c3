"""`python -m dwell.admission`: the HTTP publish endpoint and the Kafka ingress consumer
in one process."""

from __future__ import annotations

from dwell.http import serve

from .app import build_app
from .settings import AdmissionSettings


def main() -> None:
    settings = AdmissionSettings()
    serve(build_app(settings), settings)


if __name__ == "__main__":
    main()
