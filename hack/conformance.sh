#!/usr/bin/env bash
# Runs the network-policy-api conformance suite, unmodified, against the cluster that KUBECONFIG
# names: the upstream test package sigs.k8s.io/network-policy-api/conformance is compiled as it is
# published (go test -c), at the version pinned by the separate build-only module hack/conformance
# (go.mod and go.sum are committed), with the Kubernetes libraries at the product's version.
#
#   KUBECONFIG=... hack/conformance.sh nosctp [ARG...]
#                                      a diagnostic run for kernels without SCTP, not conformance:
#                                      the same tests, the suite's manifests without their SCTP
#                                      server containers (hack/conformance/nosctp)
#   hack/conformance.sh build          compile only; the last line on stdout is the directory that
#                                      holds npapi-conformance.test
#   KUBECONFIG=... hack/conformance.sh [ARG...]
#                                      compile if needed, then run TestConformanceProfiles for the
#                                      ClusterNetworkPolicy profile with every feature, writing the
#                                      report; ARGs go to the test binary after ours, so a later
#                                      flag wins (e.g. -test.run 'TestConformanceProfiles/CNPAdminTierEgressTCP$'
#                                      or -supported-features=... without -all-features=false)
#
# Environment:
#   KUBECONFIG         required to run: the suite's second client (the one that execs into pods)
#                      reads only KUBECONFIG, not the -kubeconfig flag
#   NPAPI_REPORT       where the report goes (default: ./npapi-conformance-report.yaml)
#   NETWARDEN_VERSION  the version the report names (default: git describe --tags --always --dirty)
#   NPAPI_CONTACT, NPAPI_ADDITIONAL_INFO
#                      the report's contact and additional information (the suite refuses to run
#                      without both; set NPAPI_ADDITIONAL_INFO to the CI run's link)
#   NPAPI_CONFORMANCE_DIR
#                      the cache (default: $HOME/.cache/netwarden/npapi-conformance/<version>)
#
# What the cluster needs (the suite checks the first before anything else):
# - the ClusterNetworkPolicy CRD of the same release: the suite reads its
#   policy.networking.k8s.io/bundle-version annotation and refuses any other. -all-features needs
#   the experimental channel's CRD (destinationNamedPort, node peers); both channels carry the
#   annotation.
# - a StatefulSet controller and two nodes' worth of pods: five StatefulSets of 2 replicas, each pod
#   7 containers of registry.k8s.io/e2e-test-images/agnhost:2.45 (image entrypoint /agnhost, cmd
#   pause), the servers started as /bin/bash -c "/agnhost serve-hostname|netexec|porter ..." on
#   TCP 80/8080, UDP 53/5353 and SCTP 9003/9005; one StatefulSet (centaur) is hostNetwork on ports
#   34345-34352 (TCP, UDP, SCTP). All must be Ready within 5 minutes.
# - pods/exec: every probe is "/agnhost connect --protocol=tcp|udp|sctp" exec'd in a client
#   container (TIMEOUT on stderr counts as dropped, anything else as a failure).
#
# The binary is cached and rebuilt only when go.mod, go.sum, the Go version or the build flags
# change, so a second run starts at once. Logs go to stderr.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mod="$root/hack/conformance"
GO=${GO:-go}

log() { printf 'conformance: %s\n' "$*" >&2; }

# The suite's version straight from go.mod (no go command needed, so the cached path stays instant).
npapi_version=$(awk '$1 == "sigs.k8s.io/network-policy-api" && $2 ~ /^v/ { print $2; exit }
  $1 == "require" && $2 == "sigs.k8s.io/network-policy-api" { print $3; exit }' "$mod/go.mod")
if [ -z "$npapi_version" ]; then
  log "cannot read the sigs.k8s.io/network-policy-api version from $mod/go.mod"
  exit 1
fi
out=${NPAPI_CONFORMANCE_DIR:-${HOME:-/root}/.cache/netwarden/npapi-conformance/$npapi_version}
bin=$out/npapi-conformance.test
pkg=sigs.k8s.io/network-policy-api/conformance

goversion=$("$GO" env GOVERSION)
stamp=$(cat "$mod/go.mod" "$mod/go.sum" <(echo "$goversion cgo=0 trimpath buildvcs=false $pkg") | sha256sum | cut -d' ' -f1)

uptodate() { [ -x "$bin" ] && [ -f "$out/.stamp" ] && [ "$(cat "$out/.stamp")" = "$stamp" ]; }

build() {
  if uptodate; then
    log "npapi-conformance.test ($pkg $npapi_version) is up to date in $out"
    return
  fi
  mkdir -p "$out"
  # One build at a time per directory (two runs started together build once).
  if command -v flock >/dev/null; then
    exec 9>"$out/.lock"
    flock 9
    if uptodate; then
      log "built meanwhile by another run: $out"
      return
    fi
  fi
  local start=$SECONDS tmp
  log "compiling $pkg $npapi_version (go test -c) with $goversion into $out"
  tmp=$(mktemp "$out/.build.XXXXXX")
  # -mod=mod: go.sum lists the test package's own imports, but go may want to verify more of the
  # graph than go mod tidy kept; it fills those in rather than failing. -vet=off: go test -c would
  # vet the suite (and compute vet facts for all its dependencies), which changes nothing in the
  # binary.
  if ! (cd "$mod" && GOFLAGS="-mod=mod -buildvcs=false" GOWORK=off CGO_ENABLED=0 \
    "$GO" test -c -vet=off -trimpath -o "$tmp" "$pkg" >&2); then
    rm -f "$tmp"
    log "compiling $pkg failed"
    exit 1
  fi
  mv -f "$tmp" "$bin"
  echo "$stamp" >"$out/.stamp"
  log "built in $((SECONDS - start))s: $(du -h "$bin" | cut -f1) npapi-conformance.test"
}

if [ "${1:-}" = build ]; then
  build
  echo "$out"
  exit 0
fi

if [ -z "${KUBECONFIG:-}" ]; then
  log "KUBECONFIG is not set: it must name the kubeconfig of the cluster to test"
  exit 2
fi
if [ ! -r "${KUBECONFIG%%:*}" ]; then
  log "KUBECONFIG names ${KUBECONFIG%%:*}, which cannot be read"
  exit 2
fi
# nosctp: the diagnostic run for kernels without SCTP (hack/conformance/nosctp): the same tests
# with the suite's manifests minus their SCTP server containers; no report is written.
if [ "${1:-}" = nosctp ]; then
  shift
  mkdir -p "$out"
  log "compiling the no-SCTP diagnostic run of $pkg $npapi_version into $out"
  (cd "$mod" && rm -rf nosctp/base nosctp/tests &&
    GOFLAGS="-mod=mod -buildvcs=false" GOWORK=off "$GO" run ./nosctp/gen nosctp &&
    GOFLAGS="-mod=mod -buildvcs=false" GOWORK=off CGO_ENABLED=0 "$GO" test -c -vet=off -trimpath -o "$out/npapi-nosctp.test" ./nosctp >&2)
  exec "$out/npapi-nosctp.test" -test.v -test.timeout 30m -test.run '^TestConformanceWithoutSCTPServers$' "$@"
fi

build

version=${NETWARDEN_VERSION:-$(git -C "$root" describe --tags --always --dirty 2>/dev/null || echo unknown)}
report=${NPAPI_REPORT:-$PWD/npapi-conformance-report.yaml}
case $report in /*) ;; *) report=$PWD/$report ;; esac
mkdir -p "$(dirname "$report")"

# -test.timeout: a compiled test binary has no default timeout (go test's is 10 minutes, too short
# for the whole suite, whose own README uses 20m); this bounds a hung run.
args=(
  -test.v
  -test.timeout 30m
  -test.run '^TestConformanceProfiles$'
  -conformance-profiles=ClusterNetworkPolicy
  -all-features
  -organization netwarden
  -project netwarden
  -url https://github.com/netwarden/netwarden
  -version "$version"
  -contact "${NPAPI_CONTACT:-https://github.com/netwarden/netwarden/issues/new}"
  -additional-info "${NPAPI_ADDITIONAL_INFO:-https://github.com/netwarden/netwarden/blob/main/hack/conformance.sh}"
  -report-output "$report"
)
log "running $pkg $npapi_version against $KUBECONFIG (netwarden $version); report: $report"
# The manifests are embedded in the binary (conformance/embed.go), so any working directory will do.
rm -f "$report"
set +e
"$bin" "${args[@]}" "$@"
status=$?
set -e
if [ -f "$report" ]; then
  log "report written: $report"
else
  log "no report written (the suite writes one only when it ran to the end)"
fi
exit "$status"
