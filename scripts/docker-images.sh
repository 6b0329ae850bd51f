#!/usr/bin/env bash
# From a bare Debian machine to FedOwen's Docker images, in one command.
#
#   scripts/docker-images.sh [all|engine|flower|app|sizes] [-f]
#     engine  install Debian's docker.io, docker-compose and debootstrap when missing, and
#             start dockerd when it does not answer (systemd where it runs, else in the
#             background with its log in /var/log/dockerd.log)
#     flower  flwr/superlink, flwr/supernode, flwr/superexec at the pinned version: pulled from
#             Docker Hub where it answers, else built here (docker/local/Dockerfile) on a
#             Debian bookworm root made with debootstrap and `docker import`ed as
#             fedowen/debian:bookworm, and tagged with the official names
#     app     fedowen-superexec:0.1.0 from docker/Dockerfile (the ServerApp/ClientApp SuperExec
#             with torch; also the Fleet gateway and key registration)
#     sizes   the images' sizes
#     all     all of the above (the default)
#   -f rebuilds what exists (the debootstrap root, the local Flower images, the app image).
#
# Environment: FLWR_VERSION (default: flwr's pin in requirements/lock.txt), TORCH_INDEX (the
# extra index for torch wheels; default PyTorch's CPU index when it answers, else none: PyPI's
# torch, a CUDA build of several GB on x86_64), DEBIAN_MIRROR, HOST_CA (the CA bundle pip
# needs inside the build; default /etc/ssl/certs/ca-certificates.crt). Needs root.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FLWR_VERSION="${FLWR_VERSION:-$(sed -n 's/^flwr==//p' "$ROOT/requirements/lock.txt")}"
APP_IMAGE=fedowen-superexec:0.1.0
BASE_IMAGE=fedowen/debian:bookworm
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
HOST_CA="${HOST_CA:-/etc/ssl/certs/ca-certificates.crt}"
CPU_INDEX=https://download.pytorch.org/whl/cpu
FORCE=0

say() { echo "[docker-images] $*" >&2; }
die() { say "error: $*"; exit 1; }
has_image() { docker image inspect "$1" >/dev/null 2>&1; }

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

debian_base() {
  if has_image "$BASE_IMAGE" && [[ $FORCE == 0 ]]; then return; fi
  local root
  root="$(mktemp -d /tmp/fedowen-bookworm.XXXXXX)"
  say "debootstrap bookworm into $root (about a minute)"
  debootstrap --variant=minbase bookworm "$root" "$DEBIAN_MIRROR" >"$root.log" 2>&1 \
    || die "debootstrap failed; see $root.log"
  printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s-security bookworm-security main\n' \
    "$DEBIAN_MIRROR" "$DEBIAN_MIRROR" "$DEBIAN_MIRROR" > "$root/etc/apt/sources.list"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | docker import --change 'CMD ["bash"]' - "$BASE_IMAGE" >/dev/null
  rm -rf "$root" "$root.log"
  say "imported $BASE_IMAGE"
}

flower() {
  local missing=() name
  for name in superlink supernode superexec; do
    if [[ $FORCE == 1 ]] || ! has_image "flwr/$name:$FLWR_VERSION"; then missing+=("$name"); fi
  done
  [[ ${#missing[@]} -gt 0 ]] || { say "flwr/* $FLWR_VERSION present"; return; }
  if [[ $FORCE == 0 ]] && timeout 60 docker pull -q "flwr/${missing[0]}:$FLWR_VERSION" >/dev/null 2>&1
  then
    for name in "${missing[@]:1}"; do docker pull -q "flwr/$name:$FLWR_VERSION" >/dev/null; done
    say "pulled the official flwr/* $FLWR_VERSION images"
    return
  fi
  say "Docker Hub not reachable (or -f): building flwr/{$(IFS=,; echo "${missing[*]}")}:$FLWR_VERSION here"
  debian_base
  local ctx
  ctx="$(mktemp -d /tmp/fedowen-flwr-ctx.XXXXXX)"
  cp "$ROOT/docker/local/Dockerfile" "$ROOT/requirements/lock.txt" "$ctx/"
  cp "$HOST_CA" "$ctx/host-ca.crt"
  for name in "${missing[@]}"; do
    docker build -q --target "$name" --build-arg "FLWR_VERSION=$FLWR_VERSION" \
      --build-arg "BASE_IMAGE=$BASE_IMAGE" -t "flwr/$name:$FLWR_VERSION" "$ctx" >/dev/null \
      || { rm -rf "$ctx"; die "building flwr/$name failed"; }
    say "built flwr/$name:$FLWR_VERSION"
  done
  rm -rf "$ctx"
}

app() {
  if has_image "$APP_IMAGE" && [[ $FORCE == 0 ]]; then say "$APP_IMAGE present"; return; fi
  local index="${TORCH_INDEX-unset}"
  if [[ $index == unset ]]; then
    if curl -sfm 15 -o /dev/null "$CPU_INDEX/torch/"; then index=$CPU_INDEX
    else
      index=""
      say "warning: $CPU_INDEX not reachable: torch comes from PyPI (on x86_64 a CUDA build," \
        "several GB)"
    fi
  fi
  say "building $APP_IMAGE (torch from ${index:-PyPI})"
  docker build -f "$ROOT/docker/Dockerfile" --build-arg "FLWR_VERSION=$FLWR_VERSION" \
    --build-arg "TORCH_INDEX=$index" -t "$APP_IMAGE" "$ROOT"
}

sizes() {
  docker image ls --format '{{.Repository}}:{{.Tag}}\t{{.Size}}' \
    | grep -E "^(flwr/|fedowen)" | sort
}

STEP=all
for arg in "$@"; do
  case $arg in
    all | engine | flower | app | sizes) STEP=$arg ;;
    -f) FORCE=1 ;;
    -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;p;}' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$arg' (see -h)" ;;
  esac
done
[[ $(id -u) == 0 ]] || die "run as root (it installs packages, starts dockerd, runs debootstrap)"
[[ -n $FLWR_VERSION ]] || die "no flwr== pin in requirements/lock.txt; set FLWR_VERSION"
case $STEP in
  engine) engine ;;
  flower) engine && flower ;;
  app) engine && app ;;
  sizes) sizes ;;
  all) engine && flower && app && sizes ;;
esac
