#!/usr/bin/env bash
# Builds gpuvigil's image with buildah (no daemon, no registry): `make image`.
#   scripts/build-image.sh [--test]
# 1. A Debian bookworm base with python3, made by mmdebstrap from Debian's packages, cached
#    as a tarball in ~/.cache/gpuvigil/image (built once) and imported into buildah's store.
# 2. The Containerfile, with BASE set to that image, tagged $IMAGE (the tag the manifests in
#    deploy/kubernetes name). Dependencies are pinned to the versions resolved in .venv.
# 3. --test: runs `gpuvigil check --expect-gpus 0 --json` inside the image.
# PyTorch (preflight's active checks need it) is chosen here: TORCH is a pip requirement,
# default `torch==2.13.0` from pip's configured index (a CPU wheel on a machine without
# GPUs); on a GPU cluster point pip at a CUDA build, e.g.
#   TORCH=torch==2.13.0 PIP_INDEX_URL=https://download.pytorch.org/whl/cu128 make image
# TORCH= (empty) builds an image without PyTorch: the agent and the controller do not need
# it, preflight then exits 2 (DEPENDENCY_MISSING).
# Storage: vfs under ~/.cache/gpuvigil/containers (works without overlay or user
# namespaces), chroot isolation, the host network for the build's pip downloads.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)
IMAGE=${IMAGE:-ghcr.io/gpuvigil/gpuvigil:$VERSION}
TORCH=${TORCH-torch==2.13.0}
CACHE=${GPUVIGIL_CACHE:-$HOME/.cache/gpuvigil}
BASE_TAR=$CACHE/image/base-bookworm.tar
BASE=localhost/gpuvigil-base:bookworm
STORE=(--root "$CACHE/containers/storage" --runroot "$CACHE/containers/run" --storage-driver vfs)
for tool in buildah mmdebstrap; do
  command -v "$tool" >/dev/null || { echo "build-image: $tool missing (make system-deps)" >&2; exit 2; }
done

if [ ! -s "$BASE_TAR" ]; then
  mkdir -p "$(dirname "$BASE_TAR")"
  echo "build-image: making the base with mmdebstrap (once; cached in $BASE_TAR)" >&2
  mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    bookworm "$BASE_TAR.part" http://deb.debian.org/debian
  mv "$BASE_TAR.part" "$BASE_TAR"
fi
if ! buildah "${STORE[@]}" inspect --type image "$BASE" >/dev/null 2>&1 \
   || [ "$BASE_TAR" -nt "$CACHE/containers/base.stamp" ]; then
  ctr=$(buildah "${STORE[@]}" from scratch)
  # `add` prints the layer digest on stdout, which --test keeps for the check's JSON alone
  buildah "${STORE[@]}" add --quiet "$ctr" "$BASE_TAR" / >&2
  buildah "${STORE[@]}" commit --quiet --rm "$ctr" "$BASE" >/dev/null
  touch "$CACHE/containers/base.stamp"
fi

# Wheels for gpuvigil and its dependencies, pinned to what .venv resolved, and $TORCH for
# preflight, built here where the package index is reachable and cached by pip: the image
# build itself needs no network.
CONTEXT=$(mktemp -d "${TMPDIR:-/tmp}/gpuvigil-image.XXXXXXXX")
trap 'rm -rf "$CONTEXT"' EXIT
cp Containerfile "$CONTEXT"/
mkdir -p "$CONTEXT/examples" && cp examples/*.py "$CONTEXT/examples"/
PIP=(.venv/bin/python -m pip)
[ -x .venv/bin/python ] || PIP=(python3 -m pip)
"${PIP[@]}" freeze --exclude-editable --disable-pip-version-check 2>/dev/null \
  | grep -viE '^(torch|nvidia-|triton|gpuvigil)' > "$CONTEXT/constraints.txt" || true
TORCH_ARGS=()
PACKAGE=.
# with PyTorch, the training extra (numpy) that gpuvigil.training needs: the Containerfile
# installs gpuvigil[training] then
[ -n "$TORCH" ] && TORCH_ARGS=("$TORCH") && PACKAGE=".[training]"
"${PIP[@]}" wheel --quiet --disable-pip-version-check --wheel-dir "$CONTEXT/wheels" \
  --constraint "$CONTEXT/constraints.txt" "$PACKAGE" "${TORCH_ARGS[@]}" >&2
buildah "${STORE[@]}" build --quiet --isolation chroot --network host --layers \
  --build-arg "BASE=$BASE" --build-arg "TORCH=$TORCH" -t "$IMAGE" -f "$CONTEXT/Containerfile" "$CONTEXT" >/dev/null
echo "build-image: built $IMAGE" >&2

if [ "${1:-}" = "--test" ]; then
  ctr=$(buildah "${STORE[@]}" from --quiet "$IMAGE")
  trap 'buildah "${STORE[@]}" rm "$ctr" >/dev/null 2>&1 || true; rm -rf "$CONTEXT"' EXIT
  buildah "${STORE[@]}" run --isolation chroot "$ctr" -- gpuvigil check --expect-gpus 0 --json
fi
