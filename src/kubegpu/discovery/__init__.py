"""GPU feature discovery: NVIDIA GFD's node labels from the GPUs, MIG devices and device-plugin config.

`compute_labels` is the pure core (the simulator labels its nodes with it); `agent` holds the file/Node sinks and
the loop; `health` the Node's `AcceleratedHardwareReady` condition from XIDs (node repair reads it); `cli` the
`kubegpu discover` command.
"""

from kubegpu.discovery.labels import compute_labels, is_owned_label, node_label_patch

__all__ = ["compute_labels", "is_owned_label", "node_label_patch"]
