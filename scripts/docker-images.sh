#!/usr/bin/env bash
# From a bare Debian machine to FedOwen's Docker images, in one command.
#
#   scripts/docker-images.sh [all|engine|emulation|emulation-off|flower|app|slim|sizes] [-f]
#     engine  install Debian's docker.io, docker-compose and debootstrap when missing, and
#             start dockerd when it does not answer (systemd where it runs, else in the
#             background with its log in /var/log/dockerd.log)
#     emulation      for a foreign ARCHS entry: install qemu-user-static and binfmt-support,
#                    mount binfmt_misc and register qemu-aarch64 (flags F: containers see it)
#     emulation-off  undo the registration (and the mount, when this script made it)
#     flower  flwr/superlink, flwr/supernode, flwr/superexec at the pinned version for each of
#             ARCHS: pulled from Docker Hub where it answers, else built here
#             (docker/local/Dockerfile) on a Debian bookworm root made with debootstrap
#             (--arch under qemu for a foreign one), imported as fedowen/debian:bookworm
#             (-ARCH), and tagged with the official names
#     app     fedowen-superexec:0.1.0 from docker/Dockerfile for each of ARCHS (the
#             ServerApp/ClientApp SuperExec with torch; also the Fleet gateway and key
#             registration)
#     slim    fedowen-superexec:0.1.0-cpu from docker/Dockerfile.cpu: the ClientApp's SuperExec
#             with torch's CPU build and only the ClientApp's dependencies; stops, saying why,
#             where no CPU build of the pinned torch can be reached (TORCH_INDEX)
#     sizes   the images' sizes and architectures
#     all     engine, flower, app, sizes (the default; with a foreign ARCHS, emulation first)
#   -f rebuilds what exists (the debootstrap root, the local Flower images, the app image).
#
# Tags (docs/deployment.md, "Architectures and tags"; tests/test_docker_tags.py checks them): an
# image of the host's own architecture keeps the plain tag (flwr/supernode:1.42.0), which
# compose files name; every image also gets TAG-ARCH (flwr/supernode:1.42.0-arm64), which is
# the only tag a foreign-architecture image gets. A device pulls (or loads) TAG-<its arch>.
#
# Environment: FLWR_VERSION (default: flwr's pin in requirements/lock.txt), TORCH_INDEX (the
# extra index for torch wheels; default PyTorch's CPU index when it answers, else none: PyPI's
# torch, a CUDA build of several GB on x86_64 and aarch64), DEBIAN_MIRROR, HOST_CA (the CA
# bundle pip needs inside the build; default /etc/ssl/certs/ca-certificates.crt), ARCHS
# (Debian architecture names, default the host's: e.g. ARCHS="amd64 arm64"). Needs root.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FLWR_VERSION="${FLWR_VERSION:-$(sed -n 's/^flwr==//p' "$ROOT/requirements/lock.txt")}"
APP_IMAGE=fedowen-superexec:0.1.0
SLIM_IMAGE=fedowen-superexec:0.1.0-cpu
BASE_IMAGE=fedowen/debian:bookworm
SUPPORTED_ARCHS="amd64 arm64"
NATIVE_ARCH="$(dpkg --print-architecture 2>/dev/null || echo amd64)"
ARCHS="${ARCHS:-$NATIVE_ARCH}"
BINFMT=/proc/sys/fs/binfmt_misc
BINFMT_MARK=/run/fedowen-binfmt-mounted
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
HOST_CA="${HOST_CA:-/etc/ssl/certs/ca-certificates.crt}"
CPU_INDEX=https://download.pytorch.org/whl/cpu
FORCE=0

say() { echo "[docker-images $(date +%T)] $*" >&2; }
die() { say "error: $*"; exit 1; }
has_image() { docker image inspect "$1" >/dev/null 2>&1; }
# The tag of NAME:TAG for ARCH: the plain one on the host's own architecture, else TAG-ARCH.
arch_tag() { if [[ $2 == "$NATIVE_ARCH" ]]; then echo "$1"; else echo "$1-$2"; fi; }
foreign_archs() { local a; for a in $ARCHS; do [[ $a == "$NATIVE_ARCH" ]] || echo "$a"; done; }
qemu_name() { case $1 in arm64) echo aarch64 ;; amd64) echo x86_64 ;; *) echo "$1" ;; esac; }

engine() {
  if ! command -v dockerd >/dev/null || ! command -v docker-compose >/dev/null \
      || ! command -v debootstrap >/dev/null; then
    say "installing docker.io docker-compose debootstrap (Debian packages)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io docker-compose debootstrap \
      >/dev/null
  fi
  if docker info >/dev/null 2>&1; then return; fi
  if [[ -d /run/systemd/system ]]; then
    systemctl start docker
  else
    say "starting dockerd (log: /var/log/dockerd.log)"
    nohup dockerd >>/var/log/dockerd.log 2>&1 &
  fi
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && return; sleep 1; done
  die "dockerd did not answer within 60 s; see /var/log/dockerd.log"
}

qemu_version() { qemu-aarch64-static --version 2>/dev/null | sed -n '1s/.*version \([0-9.]*\).*/\1/p'; }
qemu_recent() { local v; v="$(qemu_version)"; [[ -n $v && ${v%%.*} -ge 8 ]]; }

emulation() {
  local arch q
  [[ -n $(foreign_archs) ]] || return 0
  # bookworm's own qemu-user (7.2) segfaults in torch 2.14.1's aarch64 build (at import, or at
  # the first tensor); bookworm-backports' 10.0 imports it (19 s) and trains: install that one
  if ! command -v update-binfmts >/dev/null || ! qemu_recent; then
    say "installing qemu-user-static (bookworm-backports) and binfmt-support"
    echo "deb http://deb.debian.org/debian bookworm-backports main" \
      > /etc/apt/sources.list.d/fedowen-backports.list
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -t bookworm-backports \
      qemu-user-static binfmt-support >/dev/null
    qemu_recent || die "qemu-user is $(qemu_version): torch's aarch64 build needs 8 or newer"
  fi
  if [[ ! -e $BINFMT/register ]]; then
    mount binfmt_misc -t binfmt_misc "$BINFMT" && touch "$BINFMT_MARK"
  fi
  for arch in $(foreign_archs); do
    q="$(qemu_name "$arch")"
    [[ -e $BINFMT/qemu-$q ]] || update-binfmts --enable "qemu-$q"
    grep -q '^flags:.*F' "$BINFMT/qemu-$q" \
      || die "qemu-$q registered without flag F: containers of $arch images cannot start it"
    say "emulating $arch: $(sed -n 's/^interpreter //p' "$BINFMT/qemu-$q") (flags" \
      "$(sed -n 's/^flags: //p' "$BINFMT/qemu-$q"))"
  done
}

emulation_off() {
  local arch q
  for arch in $SUPPORTED_ARCHS; do
    q="$(qemu_name "$arch")"
    if [[ -e $BINFMT/qemu-$q ]]; then update-binfmts --disable "qemu-$q"; say "qemu-$q off"; fi
  done
  if [[ -e $BINFMT_MARK ]]; then umount "$BINFMT" && rm -f "$BINFMT_MARK"; say "binfmt_misc unmounted"; fi
}

# fedowen/debian:bookworm (host architecture) or fedowen/debian:bookworm-ARCH (under qemu).
debian_base() {
  local arch=$1 image root
  image="$(arch_tag "$BASE_IMAGE" "$arch")"
  if has_image "$image" && [[ $FORCE == 0 ]]; then arch_alias "$image" "$arch"; return; fi
  root="$(mktemp -d /tmp/fedowen-bookworm.XXXXXX)"
  if [[ $arch == "$NATIVE_ARCH" ]]; then
    say "debootstrap bookworm into $root (about a minute)"
    debootstrap --variant=minbase bookworm "$root" "$DEBIAN_MIRROR" >"$root.log" 2>&1 \
      || die "debootstrap failed; see $root.log"
  else
    [[ -e $BINFMT/qemu-$(qemu_name "$arch") ]] || die "no emulation of $arch: run the emulation step"
    say "debootstrap --arch=$arch bookworm into $root (the second stage runs under qemu: minutes)"
    { debootstrap --arch="$arch" --foreign --variant=minbase bookworm "$root" "$DEBIAN_MIRROR" \
        && chroot "$root" /debootstrap/debootstrap --second-stage; } >"$root.log" 2>&1 \
      || die "debootstrap --arch=$arch failed; see $root.log"
  fi
  printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s-security bookworm-security main\n' \
    "$DEBIAN_MIRROR" "$DEBIAN_MIRROR" "$DEBIAN_MIRROR" > "$root/etc/apt/sources.list"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  if [[ $arch == "$NATIVE_ARCH" ]]; then
    tar -C "$root" -c . | docker import --change 'CMD ["bash"]' - "$image" >/dev/null
  else
    load_rootfs "$root" "$image" "$arch"
  fi
  rm -rf "$root" "$root.log"
  arch_alias "$image" "$arch"
  say "imported $image ($(docker image inspect -f '{{.Architecture}}' "$image"))"
}

# `docker load` a root folder as a one-layer image of ARCH. (`docker import --platform` is
# ignored by a daemon without experimental features, Debian's 20.10 among them: the image
# would say amd64 and builds FROM it for arm64 fail.)
load_rootfs() {
  local root=$1 image=$2 arch=$3 dir layer_id config_id
  dir="$(mktemp -d /tmp/fedowen-rootfs.XXXXXX)"
  tar -C "$root" -cf "$dir/layer.tar" .
  layer_id="$(sha256sum "$dir/layer.tar" | cut -d' ' -f1)"
  printf '{"architecture":"%s","os":"linux","config":{"Cmd":["bash"],"Env":["PATH=%s"]},%s%s}' \
    "$arch" /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    "\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[\"sha256:$layer_id\"]}," \
    "\"history\":[{\"created_by\":\"debootstrap --arch=$arch --variant=minbase bookworm\"}]" \
    >"$dir/config.json"
  config_id="$(sha256sum "$dir/config.json" | cut -d' ' -f1)"
  mv "$dir/config.json" "$dir/$config_id.json"
  printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["layer.tar"]}]' "$config_id" "$image" \
    >"$dir/manifest.json"
  tar -C "$dir" -c manifest.json "$config_id.json" layer.tar | docker load -q >/dev/null
  rm -rf "$dir"
}

# Tag IMAGE:TAG (built for ARCH under its arch_tag) also as IMAGE:TAG-ARCH.
arch_alias() { [[ $2 == "$NATIVE_ARCH" ]] && docker tag "$1" "$1-$2"; return 0; }

flower() { local arch; for arch in $ARCHS; do flower_arch "$arch"; done; }

flower_arch() {
  local arch=$1 missing=() name tag ctx
  for name in superlink supernode superexec; do
    tag="$(arch_tag "flwr/$name:$FLWR_VERSION" "$arch")"
    if [[ $FORCE == 1 ]] || ! has_image "$tag"; then missing+=("$name"); fi
  done
  if [[ ${#missing[@]} == 0 ]]; then
    for name in superlink supernode superexec; do
      arch_alias "$(arch_tag "flwr/$name:$FLWR_VERSION" "$arch")" "$arch"
    done
    say "flwr/* $FLWR_VERSION ($arch) present"; return
  fi
  if [[ $FORCE == 0 ]] && timeout 60 docker pull -q --platform "linux/$arch" \
      "flwr/${missing[0]}:$FLWR_VERSION" >/dev/null 2>&1; then
    for name in "${missing[@]}"; do
      docker pull -q --platform "linux/$arch" "flwr/$name:$FLWR_VERSION" >/dev/null
      tag="$(arch_tag "flwr/$name:$FLWR_VERSION" "$arch")"
      [[ $tag == "flwr/$name:$FLWR_VERSION" ]] || docker tag "flwr/$name:$FLWR_VERSION" "$tag"
      arch_alias "$tag" "$arch"
    done
    say "pulled the official flwr/* $FLWR_VERSION images ($arch)"
    return
  fi
  say "Docker Hub not reachable (or -f): building flwr/{$(IFS=,; echo "${missing[*]}")}:$FLWR_VERSION" \
    "for $arch here"
  debian_base "$arch"
  ctx="$(mktemp -d /tmp/fedowen-flwr-ctx.XXXXXX)"
  cp "$ROOT/docker/local/Dockerfile" "$ROOT/requirements/lock.txt" "$ctx/"
  cp "$HOST_CA" "$ctx/host-ca.crt"
  for name in "${missing[@]}"; do
    tag="$(arch_tag "flwr/$name:$FLWR_VERSION" "$arch")"
    docker build -q --platform "linux/$arch" --target "$name" --build-arg "FLWR_VERSION=$FLWR_VERSION" \
      --build-arg "BASE_IMAGE=$(arch_tag "$BASE_IMAGE" "$arch")" -t "$tag" "$ctx" >/dev/null \
      || { rm -rf "$ctx"; die "building $tag failed"; }
    arch_alias "$tag" "$arch"
    say "built $tag ($(docker image inspect -f '{{.Architecture}}' "$tag"))"
  done
  rm -rf "$ctx"
}

torch_index() {
  local index="${TORCH_INDEX-unset}"
  if [[ $index == unset ]]; then
    if curl -sfm 15 -o /dev/null "$CPU_INDEX/torch/"; then index=$CPU_INDEX; else index=""; fi
  fi
  echo "$index"
}

app() { local arch; for arch in $ARCHS; do app_arch "$arch"; done; }

app_arch() {
  local arch=$1 tag index
  tag="$(arch_tag "$APP_IMAGE" "$arch")"
  if has_image "$tag" && [[ $FORCE == 0 ]]; then arch_alias "$tag" "$arch"; say "$tag present"; return; fi
  index="$(torch_index)"
  [[ -n $index ]] || say "warning: $CPU_INDEX not reachable: torch comes from PyPI (a CUDA 13" \
    "build on x86_64 and aarch64: several GB)"
  local check=run
  if [[ $arch != "$NATIVE_ARCH" ]]; then
    check=skip
    say "warning: torch's import is not checked in $tag: under qemu-user 7.2 torch 2.14.1's" \
      "aarch64 build segfaults (docs/deployment.md); it is checked on the device's first run"
  fi
  say "building $tag for $arch (torch from ${index:-PyPI})"
  docker build --platform "linux/$arch" -f "$ROOT/docker/Dockerfile" \
    --build-arg "FLWR_VERSION=$FLWR_VERSION" --build-arg "ARCH_SUFFIX=$(arch_tag "" "$arch")" \
    --build-arg "TORCH_INDEX=$index" --build-arg "IMPORT_CHECK=$check" -t "$tag" "$ROOT"
  arch_alias "$tag" "$arch"
}

# The slim ClientApp image needs a CPU build of the pinned torch: PyPI's Linux wheels of torch
# 2.14.1 (x86_64 and aarch64) are CUDA 13 builds whose libtorch_cpu.so and libtorch_python.so
# link libcudart, libcupti, libcudnn, libnccl and libcufile, so `pip install --no-deps` gives a
# torch that fails on import (docs/deployment.md, "The slim image").
slim() { local arch; for arch in $ARCHS; do slim_arch "$arch"; done; }

slim_arch() {
  local arch=$1 tag index
  tag="$(arch_tag "$SLIM_IMAGE" "$arch")"
  if has_image "$tag" && [[ $FORCE == 0 ]]; then say "$tag present"; return; fi
  index="$(torch_index)"
  [[ -n $index ]] || die "no CPU build of torch reachable ($CPU_INDEX does not answer; set" \
    "TORCH_INDEX to a mirror of it): PyPI's torch for Linux needs CUDA 13's libraries to import," \
    "so $tag cannot be built here"
  say "building $tag for $arch (torch from $index)"
  docker build --platform "linux/$arch" -f "$ROOT/docker/Dockerfile.cpu" \
    --build-arg "FLWR_VERSION=$FLWR_VERSION" --build-arg "ARCH_SUFFIX=$(arch_tag "" "$arch")" \
    --build-arg "TORCH_INDEX=$index" -t "$tag" "$ROOT"
  arch_alias "$tag" "$arch"
}

sizes() {
  local ref
  docker image ls --format '{{.Repository}}:{{.Tag}}' | grep -E "^(flwr/|fedowen)" | sort \
    | while read -r ref; do
        docker image inspect -f "$ref	{{.Architecture}}	{{.Size}}" "$ref" \
          | awk -F'\t' '{printf "%s\t%s\t%.2f GB\n", $1, $2, $3 / 1e9}'
      done
}

STEP=all
for arg in "$@"; do
  case $arg in
    all | engine | emulation | emulation-off | flower | app | slim | sizes) STEP=$arg ;;
    -f) FORCE=1 ;;
    -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;p;}' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$arg' (see -h)" ;;
  esac
done
[[ $(id -u) == 0 ]] || die "run as root (it installs packages, starts dockerd, runs debootstrap)"
[[ -n $FLWR_VERSION ]] || die "no flwr== pin in requirements/lock.txt; set FLWR_VERSION"
for a in $ARCHS; do
  [[ " $SUPPORTED_ARCHS " == *" $a "* ]] || die "ARCHS: '$a' is not one of: $SUPPORTED_ARCHS"
done
case $STEP in
  engine) engine ;;
  emulation) emulation ;;
  emulation-off) emulation_off ;;
  flower) engine && emulation && flower ;;
  app) engine && emulation && app ;;
  slim) engine && emulation && slim ;;
  sizes) sizes ;;
  all) engine && emulation && flower && app && sizes ;;
esac
