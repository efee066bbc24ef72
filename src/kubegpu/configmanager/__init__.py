"""Per-node configs: the node label `nvidia.com/device-plugin.config` picks one file of a mounted ConfigMap.

NVIDIA's config-manager protocol: an init container (`--oneshot`) links the selected file to a path the operand
reads before the operand starts, and a sidecar keeps following the label. Here the operands (device plugin, feature
discovery, MPS control daemon) watch that path themselves, so no shared process namespace or signal is needed.
"""
