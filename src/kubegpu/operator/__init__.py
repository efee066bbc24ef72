"""The operator: one ClusterPolicy installs, orders, validates and upgrades the GPU stack."""
