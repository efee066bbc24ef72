"""`kubegpu place`: GPU pods placed beside kube-scheduler by the placement core (`kubegpu.scheduling.placement`).

- `objects`: cluster objects to placement state and back (pure).
- `controller`: the pass — pending pods in arrival order, `choose`, the claim's allocation written, the pod bound.
- `cli`: the `kubegpu place` command.
"""
