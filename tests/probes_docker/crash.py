"""Dies without writing a result, as a segfaulting extension would."""

from __future__ import annotations

import os
from typing import Any


def observe(kit: Any) -> dict[str, Any]:
    print("difflab-test: crashing now", flush=True)
    os._exit(3)
