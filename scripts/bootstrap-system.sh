#!/usr/bin/env bash
# Installs the Debian packages behind the real servers the tests start, only when missing.
# Idempotent: a machine that has them all does nothing (no apt-get update).
set -euo pipefail

# binary -> package
declare -A want=(
  [slurmctld]=slurm-wlm
  [slurmd]=slurmd
  [munged]=munge
  [prometheus]=prometheus
  [promtool]=prometheus
  [prometheus-alertmanager]=prometheus-alertmanager
  [etcd]=etcd-server
  [go]=golang-go
  [rsync]=rsync
  [patch]=patch  # scripts/build-kube.sh applies its patch to the 1.20 source
  [chromium]=chromium
  [kubectl]=kubernetes-client
  [buildah]=buildah
  [mmdebstrap]=mmdebstrap
)
missing=()
for bin in "${!want[@]}"; do
  command -v "$bin" >/dev/null 2>&1 || missing+=("${want[$bin]}")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "bootstrap-system: missing Debian packages: ${missing[*]} (run as root or install them)" >&2
  exit 1
fi
mapfile -t pkgs < <(printf '%s\n' "${missing[@]}" | sort -u)
echo "bootstrap-system: installing ${pkgs[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# The packaged services must not start on install: the tests start their own on loopback.
printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
trap 'rm -f /usr/sbin/policy-rc.d' EXIT
apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
