// Command etcd is the etcd server, built from go.etcd.io/etcd/server/v3 at the version that
// k8s.io/kubernetes requires, for the integration tests (see hack/kube-binaries.sh).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
