"""Never returns: the runner must kill it at the timeout and keep what it printed."""

from __future__ import annotations

import time
from typing import Any


def observe(kit: Any) -> dict[str, Any]:
    print("difflab-test: hanging now", flush=True)
    time.sleep(3600)
    return {}
