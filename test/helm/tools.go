//go:build tools

// Package tools records the Helm CLI this module builds, so `go mod tidy` keeps its module required.
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
