package kubetest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Binary returns the path of a binary that hack/kube-binaries.sh builds (kube-apiserver, etcd,
// kubectl), found as Start finds them. It skips the test when it is missing, or fails it when
// $CI is set.
func Binary(t TB, name string) string {
	t.Helper()
	return filepath.Join(findBinDir(t, "", name), name)
}

// findBinDir returns the directory that holds the named binaries, or skips (fails under CI)
// the test.
func findBinDir(t TB, dir string, names ...string) string {
	t.Helper()
	source := "Options.BinDir"
	if dir == "" {
		dir, source = os.Getenv(EnvBinDir), "$"+EnvBinDir
	}
	if dir == "" {
		dir, source = defaultBinDir(), "the default cache directory of hack/kube-binaries.sh"
	}
	var missing []string
	for _, name := range names {
		if dir == "" {
			missing = append(missing, name)
			continue
		}
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			missing = append(missing, name)
		}
	}
	if len(missing) == 0 {
		return dir
	}
	where := "no directory found"
	if dir != "" {
		where = "not in " + dir + " (from " + source + ")"
	}
	msg := fmt.Sprintf("kubetest: %s %s; build them with `make kube-binaries` and set %s=$(hack/kube-binaries.sh)",
		strings.Join(missing, " and "), where, EnvBinDir)
	if os.Getenv("CI") != "" {
		t.Fatal(msg + " (CI is set: integration tests must run)")
	}
	t.Skip("skipping: " + msg)
	return ""
}

// defaultBinDir returns where hack/kube-binaries.sh puts the binaries when KUBE_BIN_DIR is unset:
// $HOME/.cache/netwarden/kube-bin/<kubernetes-version>-<etcd-version>, with the versions pinned
// by hack/kubetools/go.mod, found by walking up from the working directory. It returns "" when
// either cannot be found.
func defaultBinDir() string {
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	wd, err := os.Getwd()
	if err != nil {
		return ""
	}
	for d := wd; ; d = filepath.Dir(d) {
		if gomod, err := os.ReadFile(filepath.Join(d, "hack", "kubetools", "go.mod")); err == nil {
			k8s, etcd := requiredVersion(gomod, "k8s.io/kubernetes"), requiredVersion(gomod, "go.etcd.io/etcd/server/v3")
			if k8s == "" || etcd == "" {
				return ""
			}
			return filepath.Join(home, ".cache", "netwarden", "kube-bin", k8s+"-"+etcd)
		}
		if filepath.Dir(d) == d {
			return ""
		}
	}
}

// requiredVersion returns the version of module in a require line of gomod.
func requiredVersion(gomod []byte, module string) string {
	for _, line := range strings.Split(string(gomod), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == "require" {
			f = f[1:]
		}
		if len(f) >= 2 && f[0] == module && strings.HasPrefix(f[1], "v") {
			return f[1]
		}
	}
	return ""
}

// BinDir returns the directory that holds the named binaries (dir when it is not empty, else
// found as Start finds them), or skips the test (fails it when $CI is set).
func BinDir(t TB, dir string, names ...string) string {
	t.Helper()
	return findBinDir(t, dir, names...)
}
