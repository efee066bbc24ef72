"""The simulated node file's flock: excludes filelock users of the same `.lock` file (other processes' view),
other threads of this process, is re-entrant in one thread, and times out with `filelock.Timeout`."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import filelock
import pytest

from kubegpu.gpu.simlock import NodeFileLock


def test_excludes_filelock_and_is_reentrant(tmp_path: Path) -> None:
    path = str(tmp_path / "node.json.lock")
    lock = NodeFileLock(path, timeout=5)
    # re-entrant: the inner enter must not wait on the outer one
    with lock, lock, pytest.raises(filelock.Timeout):
        filelock.FileLock(path, timeout=0.05).acquire()
    with filelock.FileLock(path, timeout=1), pytest.raises(filelock.Timeout), NodeFileLock(path, timeout=0.05):
        pass
    with lock:  # released after the nested exits above
        pass


def test_other_threads_wait_for_it(tmp_path: Path) -> None:
    lock = NodeFileLock(str(tmp_path / "node.json.lock"), timeout=5)
    order: list[str] = []

    def other() -> None:
        with lock:
            order.append("other")

    with lock:
        thread = threading.Thread(target=other)
        thread.start()
        time.sleep(0.05)
        order.append("holder")
    thread.join(5)
    assert order == ["holder", "other"]
