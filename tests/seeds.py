"""Seeds of the random tests: fresh every run, printed on failure, replayable.

``DENSITAS_SEED=<n>`` replays a failing run with the printed seed; ``DENSITAS_FIXED_SEED=1`` uses seed 0 everywhere.
"""

from __future__ import annotations

import os


def fresh_seed() -> int:
    """The seed of one random test: ``DENSITAS_SEED`` if set, 0 under ``DENSITAS_FIXED_SEED``, else fresh."""
    if os.environ.get("DENSITAS_SEED"):
        return int(os.environ["DENSITAS_SEED"])
    if os.environ.get("DENSITAS_FIXED_SEED") is not None:
        return 0
    return int.from_bytes(os.urandom(4), "little")
