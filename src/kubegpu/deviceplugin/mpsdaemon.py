"""`kubegpu mps-control-daemon` kept in step with its config (the GPU Operator's mps-control-daemon DaemonSet).

The operator runs it on nodes whose config asks for MPS (`nvidia.com/mps.capable=true`, which feature discovery
derives from the same config). With per-node configs the config can change under a running daemon (the
config-manager re-points the file at another ConfigMap key), so the daemon watches the file: a change re-plans, and
only a different plan stops the old daemons and starts the new ones. A config without MPS stops them and waits; a
config that is invalid is logged in one line and the running daemons stay. On stop the limits record goes too, so
nothing of ours stays under the MPS root.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubegpu.errors import ConfigError, KubegpuError
from kubegpu.files import file_identity
from kubegpu.sharing.mps import DEFAULT_MPS_ROOT, MpsPlan, plans_for
from kubegpu.sharing.mps_control import LIMITS_FILE, MpsControl

log = logging.getLogger("kubegpu.deviceplugin.mps")

CONFIG_POLL_S = 0.5


class MpsDaemons:
    """The daemons the current config asks for on this node's GPUs, and what is running now."""

    def __init__(self, backend: Any, load_config: Callable[[], Any], binary: str | None) -> None:
        """`load_config` returns the merged, GPU-checked device-plugin config (raises ConfigError when invalid)."""
        self.backend = backend
        self.load_config = load_config
        self.binary = binary
        self.running: tuple[Path, list[MpsPlan]] | None = None

    def desired(self) -> tuple[Path, list[MpsPlan]]:
        config = self.load_config()
        gpus = self.backend.devices()
        mig = {g.index: self.backend.mig_devices(g.index) for g in gpus if g.mig_enabled}
        root = Path(config.flags.mps_root or DEFAULT_MPS_ROOT)
        return root, plans_for(gpus, mig, config)

    def apply(self) -> bool:
        """Make the running daemons what the config asks for; True when anything changed."""
        wanted = self.desired()
        if wanted == self.running or (not wanted[1] and self.running is None):
            return False
        self.stop()
        root, plans = wanted
        if plans:
            control = MpsControl(root, self.binary)
            recorded = control.record(plans)
            self.running = wanted  # before starting: a daemon started before a failure is stopped with the rest
            started = control.start(plans)
            log.info("MPS limits for %s recorded in %s%s", ", ".join(p.resource for p in plans), recorded,
                     " and applied" if started else "")
        else:
            log.info("the config asks for no MPS sharing; no MPS control daemon runs")
        return True

    def stop(self) -> None:
        if self.running is None:
            return
        root, plans = self.running
        MpsControl(root, self.binary).stop(plans)
        (root / LIMITS_FILE).unlink(missing_ok=True)
        self.running = None

    def follow(self, config_file: Path, stop: threading.Event, reload: threading.Event,
               poll: float = CONFIG_POLL_S) -> None:
        """Re-apply whenever `config_file` (or, through a symlink, what it points at) changes, or `reload` is
        set (SIGHUP), until `stop`. The daemons are stopped on the way out."""
        seen: object = None  # first round re-plans (a no-op when nothing changed since the caller's apply)
        try:
            while not stop.is_set():
                stop.wait(poll)
                current = file_identity(config_file)
                if current == seen and not reload.is_set():
                    continue
                seen = current
                reload.clear()
                try:
                    if self.apply():
                        log.info("%s changed; MPS daemons follow it", config_file)
                except (ConfigError, KubegpuError) as exc:
                    log.error("%s; keeping the running MPS daemons", exc)
        finally:
            self.stop()
