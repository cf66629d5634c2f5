//go:build tools

// Package images pins, for `go mod tidy`, the sources of the test images that the upstream e2e
// tests run in containers on the real node: agnhost is built from this module (see
// pykcm/testenv/testimages.py) and written as a local FROM-scratch image.
package images

import (
	_ "k8s.io/kubernetes/test/images/agnhost"
)
