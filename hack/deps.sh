#!/usr/bin/env bash
# Installs the Debian packages that building, testing and the demo need. Idempotent: it only
# calls apt-get when something is missing.
set -euo pipefail
need=()
# apt, dpkg and debian-archive-keyring: make image (and its test) fetch Debian packages.
for pkg in nftables iptables ipset iproute2 conntrack apt dpkg debian-archive-keyring; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "hack/deps.sh: missing packages ${need[*]}; run as root to install them" >&2
    exit 1
  fi
  echo "installing: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
