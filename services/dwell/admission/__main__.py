"""`python -m dwell.admission`: the HTTP publish endpoint and the Kafka ingress consumer
in one process."""

from __future__ import annotations

import gc

from dwell.http import serve

from .app import build_app
from .protocol import publish_protocol
from .settings import AdmissionSettings

# The publish path allocates several containers per message that reference counting
# frees at once; with the default gen0 threshold (700) the cycle collector would still
# run a few times per 100-message request, each pass walking the young objects (and every
# tenth one the older ones). Measured: ~35% of the CPU of a batch of ingress requests.
GC_THRESHOLDS = (50_000, 20, 100)


def main() -> None:
    settings = AdmissionSettings()
    app = build_app(settings)
    # Everything imported and built so far lives as long as the process: keep it out of
    # the collector's way.
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    serve(app, settings,
          http=publish_protocol(app.state.publish, settings.max_request_bytes))


if __name__ == "__main__":
    main()
