"""Settings for the whole suite.

Hypothesis's per-example deadline is a timing assertion: on a loaded 2-core
machine an example that writes files can take longer than 200 ms and fail
for no fault of the code (it did, in the RocksDB cache property test).
The suite makes no timing assertions, so the deadline is off everywhere;
``HYPOTHESIS_PROFILE`` may pick another registered profile.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("eddyflow", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "eddyflow"))
