"""Test support that needs real infrastructure: the real Kubernetes control plane on loopback.

`k8sbuild` builds kube-apiserver, kube-controller-manager, kube-scheduler, etcd and kwok from the Go tools module in
`test/k8s/` (versions pinned in its go.mod) into a cache outside the checkout; `controlplane` starts them on
127.0.0.1 with kwok GPU nodes and stops them again. `scripts/control-plane.sh` and the pytest fixtures in
tests/conftest.py both use it. Nothing in the product imports this package.
"""
