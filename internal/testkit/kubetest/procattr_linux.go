package kubetest

import "syscall"

// sysProcAttr makes the kernel kill etcd and kube-apiserver if the test binary dies without
// cleaning up (e.g. killed by the go test timeout).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
