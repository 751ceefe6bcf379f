#!/usr/bin/env bash
# Builds the kube-apiserver, etcd and kubectl binaries that the integration tests run
# (internal/kubetest; test/deploy runs kubectl against it), from Go modules only:
# k8s.io/kubernetes and go.etcd.io/etcd/server/v3 at the versions pinned by
# the separate module hack/kubetools (go.mod and go.sum are committed, so the build is
# reproducible). Nothing prebuilt is downloaded.
#
# The binaries are cached by version in
#   ${KUBE_BIN_DIR:-$HOME/.cache/netwarden/kube-bin/<kubernetes-version>-<etcd-version>}
# and the build is skipped when they are there and were built from the same inputs (go.mod, go.sum,
# etcd/main.go, Go version, build flags), so a second run returns at once.
#
# Logs go to stderr; the last line on stdout is the directory that holds kube-apiserver, etcd and
# kubectl:
#   KUBE_BIN_DIR=$(hack/kube-binaries.sh) go test ./internal/...
# A cold build takes several minutes on 2 cores (most of it compiling kube-apiserver). kubectl adds
# about 200 packages of its own: some 20 s of compiling when the rest is in the Go build cache, and
# nothing measurable once they are cached too (the three links run in parallel).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tools="$root/hack/kubetools"
GO=${GO:-go}

log() { printf 'kube-binaries: %s\n' "$*" >&2; }

# Versions straight from go.mod (no go command needed, so the cached path stays instant).
modversion() {
  awk -v m="$1" '$1 == m && $2 ~ /^v/ { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$tools/go.mod"
}
k8s_version=$(modversion k8s.io/kubernetes)
etcd_version=$(modversion go.etcd.io/etcd/server/v3)
if [ -z "$k8s_version" ] || [ -z "$etcd_version" ]; then
  log "cannot read the k8s.io/kubernetes and go.etcd.io/etcd/server/v3 versions from $tools/go.mod"
  exit 1
fi

out=${KUBE_BIN_DIR:-${HOME:-/root}/.cache/netwarden/kube-bin/$k8s_version-$etcd_version}

# k8s.io/component-base/version reports what the apiserver's /version serves and what
# `kubectl version` prints; k8s.io/client-go/pkg/version goes into client User-Agents (both are set
# as Kubernetes' own hack/lib/version.sh does).
major=${k8s_version#v}; major=${major%%.*}
minor=${k8s_version#v*.}; minor=${minor%%.*}
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$k8s_version"
  ldflags+=" -X $pkg.gitMajor=$major"
  ldflags+=" -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean"
done

# What is built: main packages of hack/kubetools (the tool directives of its go.mod, and ./etcd)
# and the binary each produces in $out.
packages=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl k8s.io/kubernetes/cmd/kube-proxy ./etcd)
binaries=(kube-apiserver kubectl kube-proxy etcd)

goversion=$("$GO" env GOVERSION)
stamp=$(cat "$tools/go.mod" "$tools/go.sum" "$tools/etcd/main.go" <(echo "$goversion $ldflags cgo=0 trimpath buildvcs=false ${packages[*]}") | sha256sum | cut -d' ' -f1)

uptodate() {
  local b
  for b in "${binaries[@]}"; do
    [ -x "$out/$b" ] || return 1
  done
  [ -f "$out/.stamp" ] && [ "$(cat "$out/.stamp")" = "$stamp" ]
}

if uptodate; then
  log "kube-apiserver and kubectl $k8s_version and etcd $etcd_version are up to date in $out"
  echo "$out"
  exit 0
fi

mkdir -p "$out"
# One build at a time per directory (e.g. two test runs started together).
if command -v flock >/dev/null; then
  exec 9>"$out/.lock"
  flock 9
  if uptodate; then
    log "built meanwhile by another run: $out"
    echo "$out"
    exit 0
  fi
fi

start=$SECONDS
cd "$tools"
# -buildvcs=false: the etcd main package lies in this repository; stamping its git state would
# make the binary differ from commit to commit (and fails where git cannot read the checkout).
export GOFLAGS="-mod=mod -buildvcs=false" GOWORK=off CGO_ENABLED=0
log "building kube-apiserver and kubectl $k8s_version and etcd $etcd_version with $goversion into $out"
log "downloading modules (through the Go module proxy)"
"$GO" mod download

tmp=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
log "compiling (a cold build takes several minutes on 2 cores; progress every 100 packages)"
# -v names each package as it is compiled: count those, pass everything else (errors) through.
set +e
"$GO" build -v -trimpath -ldflags "$ldflags" -o "$tmp/" "${packages[@]}" 2>&1 |
  {
    n=0
    while IFS= read -r line; do
      if [[ $line =~ ^[A-Za-z0-9._~/-]+$ ]]; then
        n=$((n + 1))
        if ((n % 100 == 0)); then log "$n packages compiled ($((SECONDS - start))s)"; fi
      else
        printf '%s\n' "$line" >&2
      fi
    done
  }
status=${PIPESTATUS[0]}
set -e
if [ "$status" != 0 ]; then
  log "go build failed (exit $status)"
  exit "$status"
fi

sizes=()
for b in "${binaries[@]}"; do
  mv -f "$tmp/$b" "$out/$b"
  sizes+=("$(du -h "$out/$b" | cut -f1) $b")
done
echo "$stamp" >"$out/.stamp"
log "built in $((SECONDS - start))s: $(IFS=,; echo "${sizes[*]}" | sed 's/,/, /g')"
echo "$out"
