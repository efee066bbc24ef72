"""The simulated node file's lock: flock(2) on `<file>.lock`, the lock `filelock` takes on Unix too, so processes
using either one exclude each other — at a fraction of filelock's cost per acquire. The sim backend takes it for
every operation, and filelock's bookkeeping (about 0.2 ms an acquire) was a large share of a DRA prepare on a
simulated node. Re-entrant within a thread; a thread lock orders this process's threads, flock the processes.
A lock not had within the timeout raises `filelock.Timeout`, as before.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from types import TracebackType

import filelock

_POLL_S = 0.005


class NodeFileLock:
    def __init__(self, path: str, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        self._thread = threading.RLock()
        self._depth = 0
        self._fd = -1

    def __enter__(self) -> NodeFileLock:
        if not self._thread.acquire(timeout=self.timeout):
            raise filelock.Timeout(self.path)
        if self._depth == 0:
            try:
                self._fd = self._flock()
            except BaseException:
                self._thread.release()
                raise
        self._depth += 1
        return self

    def _flock(self) -> int:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise filelock.Timeout(self.path) from None
                time.sleep(_POLL_S)
            except BaseException:
                os.close(fd)
                raise

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._depth -= 1
        if self._depth == 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1
        self._thread.release()
