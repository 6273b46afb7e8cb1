"""The broker's notion of time.

Due times are wall-clock epoch ms, but waiting must not follow wall-clock steps: a clock
set back an hour would hold messages an hour, one set forward would release them early.
So the broker reads the wall clock once, at start, and from then on advances it with the
monotonic clock (which NTP slews but never steps). Tests inject their own wall clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Clock:
    def __init__(self, wall_ms: Callable[[], float] | None = None,
                 monotonic_s: Callable[[], float] | None = None) -> None:
        self._wall = wall_ms or (lambda: time.time() * 1000)
        self._mono = monotonic_s or time.monotonic
        self._anchor_wall = self._wall()
        self._anchor_mono = self._mono()

    def now_ms(self) -> int:
        """Epoch ms, anchored at start and advanced monotonically."""
        return int(self._anchor_wall + (self._mono() - self._anchor_mono) * 1000)

    def wall_skew_ms(self) -> int:
        """How far the wall clock has stepped away from ours (reported, never followed)."""
        return int(self._wall() - self.now_ms())

    def monotonic(self) -> float:
        return self._mono()
