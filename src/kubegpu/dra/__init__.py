"""kubegpu's DRA kubelet plugin (node agent): ResourceSlices for the node's GPUs, NodePrepareResources /
NodeUnprepareResources with a crash-safe checkpoint, CDI specs, dynamic MIG, and the `kubegpu dra` commands.

The scheduler-side allocator lives in `kubegpu.scheduling.dra` (pure); this package is the node side.
"""
