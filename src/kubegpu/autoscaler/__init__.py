"""GPU-aware node autoscaler: NodePools and NodeClaims in Karpenter's shape, under the `kubegpu.io/v1` group."""
