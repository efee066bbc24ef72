"""What a shared GPU is — resource names, the device inventory a sharing config yields, placement-aware MIG apply,
MPS slice state, node capacity and pod attribution — in one place every component stands on and none owns.

Node agents (device plugin, DRA driver, discovery, MIG manager, exporter, partition agent) and the cluster
controllers (partitioner, autoscaler, operator) import from here, never from each other.
"""
