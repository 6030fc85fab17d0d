"""The probe process's clocks, moved forward by the lab instead of waited out.

A deferred release times out when the build's own clock says so (``time.monotonic()``
read against a deadline the build computed). A probe that must see a hold time out
used to sleep through the forced timeout; on a busy machine a sleep also made the
checks that must come *before* the deadline race the wall clock. :class:`LabClock`
answers ``time.monotonic``, ``time.time`` and ``time.perf_counter`` (and their ``_ns``
forms) with the real clock plus an offset the probe advances: every reader in the
build sees time pass exactly as if the probe had slept, wherever the build reads it
-- ``time.monotonic`` through the module, or the function bound under another name in
any SGLang module (found by following the build's imports, as
:func:`harness.runtime.swapped_at_import_sites` does for every stand-in).

Not moved: threads waiting on a timeout inside the standard library (``threading``
and ``queue`` bound ``monotonic`` at their own import); no scenario that uses this
clock has such a wait. Each advance is recorded as a ``clock_advanced`` event: the
lab chose when the time passed.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from difflab.probe.kit import Kit
from harness.runtime import swapped_at_import_sites

CLOCKS = ("monotonic", "time", "perf_counter")
"""The float clocks a deadline can be read from; each ``_ns`` form moves with it."""


@dataclass
class LabClock:
    """Real time plus ``offset`` seconds, for every clock in :data:`CLOCKS`, while :meth:`running`."""

    kit: Kit
    offset: float = 0.0
    advances: list[float] = field(default_factory=list)

    def _seconds(self, real: Callable[[], float]) -> Callable[[], float]:
        def clock() -> float:
            return real() + self.offset

        return clock

    def _nanoseconds(self, real: Callable[[], int]) -> Callable[[], int]:
        def clock() -> int:
            return real() + int(self.offset * 1e9)

        return clock

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The clocks answered by this one while the block runs (offset 0 until :meth:`advance`)."""
        with contextlib.ExitStack() as stack:
            for name in CLOCKS:
                stack.enter_context(swapped_at_import_sites(time, name, self._seconds(getattr(time, name))))
                ns = f"{name}_ns"
                stack.enter_context(swapped_at_import_sites(time, ns, self._nanoseconds(getattr(time, ns))))
            yield

    def advance(self, seconds: float, why: str) -> None:
        """``seconds`` pass for every reader of the clocks, at once (recorded, with the reason)."""
        if seconds < 0:
            raise ValueError(f"the clock only moves forward, not by {seconds} s")
        self.offset += seconds
        self.advances.append(seconds)
        self.kit.event("clock_advanced", seconds=seconds, why=why)
