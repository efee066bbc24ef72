"""Silent, one-thread HiGHS instances for every solver in kubegpu: the partitioner's exact planner and the placement
policy's leftover prices. Process plumbing (stdout and threads), not optimisation, so it sits low in the layers
where any component may use it."""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from typing import Any

import highspy


class HighsLoader:
    """Builds silent `highspy.Highs` instances for one user. HiGHS prints its banner on stdout when the first
    instance of the process is built, which would corrupt `kubegpu plan -o json` or `kubegpu trace replay -o json`:
    a loader's first construction runs with file descriptor 1 pointed at /dev/null (a later loader's first one
    does too, harmlessly: the banner is gone by then). Loading the library takes a second or so on a busy machine,
    so the planner calls `warm_up` before a plan's budget starts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._quiet = False

    def warm_up(self) -> None:
        self.new()

    def new(self) -> Any:
        with self._lock:
            if self._quiet:
                highs = highspy.Highs()
            else:
                sys.stdout.flush()
                saved = os.dup(1)
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 1)
                try:
                    highs = highspy.Highs()
                    highs.setOptionValue("output_flag", False)
                    ctypes.CDLL(None).fflush(None)
                finally:
                    os.dup2(saved, 1)
                    os.close(saved)
                    os.close(devnull)
                self._quiet = True
        highs.setOptionValue("output_flag", False)
        # one thread: the planner's programs are small and HiGHS's worker threads mostly spin (a fifth of a
        # simulated day's plan CPU on 800 GPUs), taking cores from the controller that runs beside it
        highs.setOptionValue("threads", 1)
        return highs
