// Command etcd is the upstream etcd server, at the version k8s.io/kubernetes
// itself depends on.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
