"""GilCounter: a thread that counts only while it holds the GIL, so code run beside it shows
whether it gave the GIL up (numpy copies, torch calls, lock waits). The switch interval is set to
100 s, so nothing takes the GIL from the caller by force during a measurement: the count moves
only when the caller gives the GIL up itself. The counter gives it back on its own (a sleep(0)
every few thousand counts), so the caller never waits a switch interval to win it back. Used by
tests/test_engine_host.py and perf/bench_engine_host.py (issue 34: in the moss_tts stub every
hand-off is a wait for the GIL behind ~256 stream threads)."""

from __future__ import annotations

import sys
import threading
import time

SWITCH_INTERVAL_S = 100.0  # longer than any measurement: no forced hand-over


class GilCounter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, name="gil-counter", daemon=True)

    def _spin(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                self._count += 1
                count = self._count
            if count % 4096 == 0:
                time.sleep(0)  # hands the GIL back to a caller waiting for it

    def count(self) -> int:
        with self._lock:
            return self._count

    def __enter__(self) -> "GilCounter":
        self._interval = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._thread.start()
        time.sleep(0.01)  # it runs; the caller wins the GIL back at the next voluntary release
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        sys.setswitchinterval(self._interval + 5e-7)  # CPython cuts to whole µs: set(get()) would lose one
        self._thread.join(5)
