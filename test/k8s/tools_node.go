//go:build tools

package tools

// The kubelet of the real-node tier (docs/testing.md), built from the same pinned Kubernetes as the control plane.
// It lives in a file of its own so the control plane's build stamp (go.mod, go.sum, tools.go) does not change
// with it: kubegpu.testing.nodebuild stamps it separately.
import (
	_ "k8s.io/kubernetes/cmd/kubelet"
)
