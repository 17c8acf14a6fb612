//go:build tools

// Package tools pins the commands built from this module; it is never compiled.
package tools

import _ "sigs.k8s.io/cri-tools/cmd/crictl"
