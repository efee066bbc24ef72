//go:build tools

// Package tools records the node binaries this module builds (containerd, its CLI and runc shim, and runc), so
// `go mod tidy` keeps their modules required. The kubelet is built from ../k8s (the pinned Kubernetes).
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
	_ "github.com/opencontainers/runc"
)
