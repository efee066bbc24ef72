"""Graceful shutdown for the controllers' and agents' loops: SIGTERM finishes the current step, then exits.

Kubernetes sends SIGTERM, waits `terminationGracePeriodSeconds`, then SIGKILLs. Python's default SIGTERM handling
ends the process wherever it is — half-way through applying a MIG layout or between a NodeClaim create and its
bookkeeping. `stop_on_signals` turns the first SIGTERM/SIGINT into an event the loop checks between steps (and
waits on instead of sleeping), so the step in progress completes; a second signal abandons it at once.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

__all__ = ["stop_on_signals"]

log = logging.getLogger(__name__)


def stop_on_signals(signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)) -> threading.Event:
    """Install handlers (main thread only) and return the event they set; the second signal exits at once."""
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            raise SystemExit(128 + signum)
        log.info("signal %d: finishing the current step, then exiting (again to stop at once)", signum)
        stop.set()

    for sig in signals:
        signal.signal(sig, handler)
    return stop
