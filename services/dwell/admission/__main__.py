"""`python -m dwell.admission`: the HTTP publish endpoint and the Kafka ingress consumer
in one process."""

from __future__ import annotations

import gc

from dwell.http import serve

from .app import build_app, serve_publishes
from .settings import AdmissionSettings

# The publish path allocates several containers per message that reference counting
# frees at once; with the default gen0 threshold (700) the cycle collector would still
# run a few times per 100-message request, each pass walking the young objects (and every
# tenth one the older ones), for garbage that holds no cycles.
GC_THRESHOLDS = (50_000, 20, 100)


def main() -> None:
    settings = AdmissionSettings()
    app = build_app(settings)
    # Everything imported and built so far lives as long as the process: keep it out of
    # the collector's way.
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    serve(serve_publishes(app, settings), settings)


if __name__ == "__main__":
    main()
