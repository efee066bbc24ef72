"""SIGTERM lets the step in progress finish; a second signal stops at once (issue #18, graceful shutdown)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from kubegpu.shutdown import stop_on_signals


@pytest.fixture
def restore_handlers() -> Iterator[None]:
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_first_sigterm_sets_the_event_second_exits(restore_handlers: None) -> None:
    stop = stop_on_signals()
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop.wait(2.0)
    with pytest.raises(SystemExit) as exc:
        os.kill(os.getpid(), signal.SIGTERM)
        signal.sigtimedwait([], 0.1) if hasattr(signal, "sigtimedwait") else None
    assert exc.value.code == 128 + signal.SIGTERM


def test_a_loop_finishes_its_step_then_exits_zero() -> None:
    script = textwrap.dedent("""
        import os, signal, sys, time
        from kubegpu.shutdown import stop_on_signals
        stop = stop_on_signals()
        steps = 0
        while not stop.is_set():
            os.kill(os.getpid(), signal.SIGTERM) if steps == 2 else None
            time.sleep(0.05)  # the step: must not be cut short
            steps += 1
            print("step", steps, flush=True)
            stop.wait(0.01)
        print("clean exit", flush=True)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0
    assert result.stdout.splitlines() == ["step 1", "step 2", "step 3", "clean exit"]
