#!/usr/bin/env bash
# Builds a real kube-apiserver, kube-scheduler and kube-controller-manager (v1.20.2) from
# Debian bookworm's `kubernetes` source package, the only offline source of them here.
# Cached outside the repository; a second run does nothing. ~6 minutes on 2 cores.
#
# One patch is applied (kube-1.20-reflect2-go1.18.patch): the vendored reflect2 v1.0.1
# predates Go 1.18's change to reflect.mapiterinit, and built with Debian's Go 1.19 the API
# server dies ("fatal error: fault" in reflect2's UnsafeIterate) on the first custom
# resource it stores. Binaries built before the patch lack the stamp and are rebuilt.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
patches=(kube-1.20-reflect2-go1.18.patch)
dest="${GPUVIGIL_KUBE_BIN:-$HOME/.cache/gpuvigil/k8s-1.20.2}"
bins=(kube-apiserver kube-scheduler kube-controller-manager)
stamp="$dest/patches"
have=1
for b in "${bins[@]}"; do [ -x "$dest/$b" ] || have=0; done
[ "$(cat "$stamp" 2>/dev/null)" = "${patches[*]}" ] || have=0
[ $have = 1 ] && exit 0

work="$(mktemp -d "${TMPDIR:-/tmp}/gpuvigil-kube-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/apt/sources.list.d" "$work/apt/lists/partial" "$work/apt/cache/archives/partial"
cat > "$work/apt/sources.list.d/debian-src.sources" <<SRC
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
cat > "$work/apt.conf" <<CONF
Dir::Etc::SourceList "/dev/null";
Dir::Etc::SourceParts "$work/apt/sources.list.d";
Dir::State::Lists "$work/apt/lists";
Dir::Cache "$work/apt/cache";
CONF
export APT_CONFIG="$work/apt.conf"
apt-get update -qq
(cd "$work" && apt-get source --download-only -qq kubernetes/bookworm)
tarball="$(ls "$work"/kubernetes_*.orig.tar.* | head -n1)"
mkdir -p "$work/src"
tar -xf "$tarball" -C "$work/src" --strip-components=1
cd "$work/src"
for p in "${patches[@]}"; do patch -s -p1 < "$here/$p"; done
GOPROXY=off CGO_ENABLED=0 GOFLAGS=-mod=vendor make WHAT="cmd/kube-apiserver cmd/kube-scheduler cmd/kube-controller-manager" \
  KUBE_GIT_VERSION=v1.20.2 KUBE_GIT_TREE_STATE=clean >"$work/build.log" 2>&1 || {
  tail -40 "$work/build.log" >&2; exit 1; }
mkdir -p "$dest"
for b in "${bins[@]}"; do cp "_output/local/bin/linux/amd64/$b" "$dest/$b.tmp" && mv "$dest/$b.tmp" "$dest/$b"; done
echo "${patches[*]}" > "$stamp"
echo "build-kube: binaries in $dest"
