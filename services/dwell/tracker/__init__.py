"""The tracker: the delay logs' shared index in Redis, the subscription registry, the
restage and the trim."""

from pathlib import Path
from typing import Final

# The tracker's Redis scripts (the ingest's and the registry's).
LUA_DIR: Final = Path(__file__).parent / "lua"
