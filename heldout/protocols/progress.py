"""A study's console progress (:class:`Progress`)."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any


class Progress:
    """Console progress of a study: per running cell the metric calls used / budget, the
    best-so-far (optimizer-visible) and an ETA. A tqdm bar per cell on a terminal; plain lines
    (at each quarter of a cell's budget, and when it ends) otherwise."""

    def __init__(self, total: int, stream=None, enabled: bool = True) -> None:
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.total = total
        self.done = 0
        self._bars: dict[str, Any] = {}
        self._quarter: dict[str, int] = {}
        self._started: dict[str, float] = {}
        self._lock = threading.Lock()

    def update(self, label: str, used: int, budget: int, best: float | None) -> None:
        if not self.enabled:
            return
        with self._lock:
            start = self._started.setdefault(label, time.monotonic())
            best_text = "-" if best is None else f"{best:.6g}"
            if self.tty:
                bar = self._bars.get(label)
                if bar is None:
                    from tqdm import tqdm

                    bar = self._bars[label] = tqdm(total=max(budget, 1), desc=label, unit="call", leave=False,
                                                   file=self.stream, position=len(self._bars))
                bar.n = used
                bar.set_postfix_str(f"best {best_text}", refresh=True)
                return
            quarter = (4 * used) // max(budget, 1)
            if quarter > self._quarter.get(label, 0):
                self._quarter[label] = quarter
                elapsed = time.monotonic() - start
                eta = elapsed / used * (budget - used) if used else float("nan")
                print(f"  {label}: {used}/{budget} metric calls, best-so-far {best_text}, ETA {eta:.0f} s",
                      file=self.stream, flush=True)

    def scoring(self, label: str, split: str, done: int, total: int, errors: int) -> None:
        """Held-out scoring of a cell: examples scored of the split's total, and infrastructure
        failures so far (each is retried; any left makes the cell incomplete)."""
        if not self.enabled:
            return
        with self._lock:
            bar = self._bars.pop(label, None)
            if bar is not None:  # the optimisation bar is done
                bar.close()
            failures = f", {errors} infrastructure failure(s)" if errors else ""
            print(f"  {label}: held-out {split} {done}/{total} scored{failures}", file=self.stream, flush=True)

    def finished(self, label: str, summary: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with self._lock:
            self.done += 1
            bar = self._bars.pop(label, None)
            if bar is not None:
                bar.close()
            status = summary["status"]
            detail = ""
            if summary.get("skipped"):
                detail = " (already done)"
            if status == "ok":
                detail += f", test {summary.get('test_score')}"
            elif summary.get("error"):
                detail += f": {summary['error']}"
            print(f"[{self.done}/{self.total}] {label}: {status}{detail}", file=self.stream, flush=True)


__all__ = ["Progress"]
