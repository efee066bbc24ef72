"""The device plugin's MPS control daemons: one `nvidia-cuda-mps-control` per MPS-shared resource.

The adapter lives in the shared layer (`kubegpu.sharing.mps_control`), since the DRA driver starts one per
MPS-shared claim and node agents never import each other; this module keeps the device plugin's names for it.
"""

from __future__ import annotations

from kubegpu.sharing.mps import MpsPlan, plans_for
from kubegpu.sharing.mps_control import LIMITS_FILE, MPS_CONTROL, MpsControl, find_mps_control

__all__ = ["LIMITS_FILE", "MPS_CONTROL", "MpsControl", "MpsPlan", "find_mps_control", "plans_for"]
