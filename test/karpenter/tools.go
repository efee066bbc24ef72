//go:build tools

// Package tools records what this module builds, so `go mod tidy` keeps Karpenter's module required.
package tools

import (
	_ "sigs.k8s.io/karpenter/kwok"
	_ "sigs.k8s.io/karpenter/pkg/controllers/provisioning/scheduling"
)
