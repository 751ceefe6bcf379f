#!/usr/bin/env bash
# Builds the Kubernetes binaries that the tests run, from Go modules only: k8s.io/kubernetes and
# go.etcd.io/etcd/server/v3 at the versions pinned by the separate module hack/kubetools (go.mod and
# go.sum are committed, so the build is reproducible). Nothing prebuilt is downloaded.
#
#   hack/kube-binaries.sh       kube-apiserver, etcd and kubectl (the integration tests,
#                               internal/kubetest; test/deploy runs kubectl), kube-proxy
#                               (test/services), and kube-controller-manager, kube-scheduler and
#                               agnhost (the multi-node cluster that runs upstream suites, issue 35)
#   hack/kube-binaries.sh e2e   e2e.test, Kubernetes' e2e suite (go test -c k8s.io/kubernetes/test/e2e),
#                               on demand only: it links some 2,800 packages into ~115 MB. It runs
#                               without ginkgo: e2e.test --ginkgo.focus=... --kubeconfig=...
#
# The binaries are cached by version in
#   ${KUBE_BIN_DIR:-$HOME/.cache/netwarden/kube-bin/<kubernetes-version>-<etcd-version>}
# and a build is skipped when its binaries are there and were built from the same inputs (go.mod,
# go.sum, etcd/main.go, Go version, build flags, package list), so a second run returns at once.
# Each set has its own stamp (.stamp, .stamp-e2e): building e2e.test never rebuilds the others.
#
# Logs go to stderr; the last line on stdout is the directory that holds the binaries:
#   KUBE_BIN_DIR=$(hack/kube-binaries.sh) go test ./internal/...
# A cold build takes several minutes on 2 cores (most of it compiling kube-apiserver). kubectl adds
# about 200 packages of its own: some 20 s of compiling when the rest is in the Go build cache, and
# nothing measurable once they are cached too (the links run in parallel). kube-controller-manager,
# kube-scheduler and agnhost share most of kube-apiserver's packages: with those in the Go build
# cache they added some 330 packages and 4.5 minutes. e2e.test then took 10.5 minutes, half of it
# go test's vet (now off), and relinks in about 20 s.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tools="$root/hack/kubetools"
GO=${GO:-go}

log() { printf 'kube-binaries: %s\n' "$*" >&2; }

mode=${1:-default}
case $mode in
  default | e2e) ;;
  *)
    echo "usage: $0 [e2e]" >&2
    exit 2
    ;;
esac

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

# k8s.io/component-base/version reports what the apiserver's /version serves, what
# `kubectl version` and `e2e.test --version` print, and what the e2e framework compares with the
# server's; k8s.io/client-go/pkg/version goes into client User-Agents (both are set as Kubernetes'
# own hack/lib/version.sh does).
major=${k8s_version#v}; major=${major%%.*}
minor=${k8s_version#v*.}; minor=${minor%%.*}
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$k8s_version"
  ldflags+=" -X $pkg.gitMajor=$major"
  ldflags+=" -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean"
done

# What is built: main packages of hack/kubetools (the tool directives of its go.mod, and ./etcd),
# or the e2e test package (whose test-only dependencies go.sum also lists), and the binaries they
# produce in $out.
if [ "$mode" = e2e ]; then
  what="e2e.test $k8s_version"
  packages=(k8s.io/kubernetes/test/e2e)
  binaries=(e2e.test)
  stampfile=$out/.stamp-e2e
else
  what="Kubernetes $k8s_version and etcd $etcd_version"
  packages=(
    k8s.io/kubernetes/cmd/kube-apiserver
    k8s.io/kubernetes/cmd/kubectl
    k8s.io/kubernetes/cmd/kube-proxy
    k8s.io/kubernetes/cmd/kube-controller-manager
    k8s.io/kubernetes/cmd/kube-scheduler
    k8s.io/kubernetes/test/images/agnhost
    ./etcd
  )
  binaries=(kube-apiserver kubectl kube-proxy kube-controller-manager kube-scheduler agnhost etcd)
  stampfile=$out/.stamp
fi

goversion=$("$GO" env GOVERSION)
stamp=$(cat "$tools/go.mod" "$tools/go.sum" "$tools/etcd/main.go" <(echo "$goversion $ldflags cgo=0 trimpath buildvcs=false ${packages[*]}") | sha256sum | cut -d' ' -f1)

uptodate() {
  local b
  for b in "${binaries[@]}"; do
    [ -x "$out/$b" ] || return 1
  done
  [ -f "$stampfile" ] && [ "$(cat "$stampfile")" = "$stamp" ]
}

if uptodate; then
  log "${binaries[*]} ($what) are up to date in $out"
  echo "$out"
  exit 0
fi

mkdir -p "$out"
# One build at a time per directory (e.g. two test runs started together); the e2e build waits
# too, since both may touch the Go build cache for the same packages and the same temporary names.
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
log "building ${binaries[*]} ($what) with $goversion into $out"
log "downloading modules (through the Go module proxy)"
"$GO" mod download

tmp=$(mktemp -d "$out/.build.XXXXXX")
ticker=
cleanup() {
  if [ -n "$ticker" ]; then kill "$ticker" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

set +e
if [ "$mode" = e2e ]; then
  # go test has no -v that names compiled packages (its -v is the test binary's), so the progress
  # is only the time spent.
  log "compiling (e2e.test takes about 5 minutes on 2 cores when the other binaries are built; a line every minute)"
  # The ticker checks that this script still runs, so a kill -9 of the script ends it too; it
  # holds neither the script's stdout (a caller's $(...) would wait for it) nor the lock.
  (
    while sleep 60 && kill -0 $$ 2>/dev/null; do log "still compiling ($((SECONDS - start))s)"; done
  ) >/dev/null 9>&- &
  ticker=$!
  # -vet=off: go test -c vets the test package too, which needs vet facts for all of its ~2,800
  # dependencies (about 5 minutes on 2 cores) and changes nothing in the binary.
  "$GO" test -c -vet=off -trimpath -ldflags "$ldflags" -o "$tmp/e2e.test" "${packages[@]}" >&2
  status=$?
else
  log "compiling (a cold build takes several minutes on 2 cores; progress every 100 packages)"
  # -v names each package as it is compiled: count those, pass everything else (errors) through.
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
fi
set -e
if [ "$status" != 0 ]; then
  log "building ${binaries[*]} failed (exit $status)"
  exit "$status"
fi

sizes=()
for b in "${binaries[@]}"; do
  mv -f "$tmp/$b" "$out/$b"
  sizes+=("$(du -h "$out/$b" | cut -f1) $b")
done
echo "$stamp" >"$stampfile"
log "built in $((SECONDS - start))s: $(IFS=,; echo "${sizes[*]}" | sed 's/,/, /g')"
echo "$out"
