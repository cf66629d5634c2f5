// Command kubeadm is the upstream kubeadm, built unchanged: the kind node image runs it to
// bootstrap its nodes, with the control-plane images built from this same module.
package main

import (
	_ "time/tzdata"

	"k8s.io/kubernetes/cmd/kubeadm/app"
	utilerrors "k8s.io/kubernetes/cmd/kubeadm/app/util/errors"
)

func main() {
	utilerrors.HandleError(app.Run())
}
