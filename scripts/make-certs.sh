#!/usr/bin/env bash
# TLS certificates and SuperNode authentication keys for a FedOwen deployment.
#
#   scripts/make-certs.sh [-d DIR] [-n NUM_NODES] [-p PREFIX] [-s SAN]... [-f]
#       DIR/ca.crt, ca.key            self-signed CA (keep ca.key offline)
#       DIR/superlink.crt, .key       the SuperLink's certificate, signed by the CA; its SANs are
#                                     localhost, 127.0.0.1, superlink and fleet-gateway (compose
#                                     service names)
#                                     and every -s value (a DNS name or an IPv4/IPv6 address)
#       DIR/supernodes/PREFIX<i>      ECDSA P-384 key pair of SuperNode i = 0..NUM_NODES-1
#       DIR/supernodes/PREFIX<i>.pub  (OpenSSH format, what flower-supernode and flwr expect)
#   scripts/make-certs.sh register [-d DIR] [-w SECONDS] SUPERLINK_CONNECTION
#   scripts/make-certs.sh register [-d DIR] [-w SECONDS] -a HOST:PORT
#       `flwr supernode register` every DIR/supernodes/*.pub with the running SuperLink named
#       SUPERLINK_CONNECTION in $FLWR_HOME/config.toml (default ~/.flwr/config.toml), or at
#       HOST:PORT trusting DIR/ca.crt. Keys registered before are skipped; -w retries for up to
#       SECONDS while the SuperLink is not reachable yet (default 0).
#
# Defaults: DIR=docker/certs, NUM_NODES=3, PREFIX=site-. Existing files are kept unless -f.
# Private keys are mode 600; the flwr images run as uid 49999, so for Docker mounts run
# `sudo chown -R 49999:49999 DIR`. Needs openssl and ssh-keygen; `register` needs flwr on PATH.
set -euo pipefail

DIR=docker/certs
NUM_NODES=3
PREFIX=site-
FORCE=0
SANS=()

usage() { sed -n '2,/^set -euo/{/^set -euo/d;p;}' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
need() { command -v "$1" >/dev/null || { echo "make-certs.sh: '$1' not found; install it" >&2; exit 1; }; }

register() {
  need flwr
  local target=$1 wait_s=$2 pub name out deadline
  shopt -s nullglob
  local keys=("$DIR"/supernodes/*.pub)
  [[ ${#keys[@]} -gt 0 ]] || { echo "make-certs.sh: no $DIR/supernodes/*.pub; make keys first" >&2; exit 1; }
  if [[ $target == *:* ]]; then  # an address: a throwaway FLWR_HOME with one TLS connection
    export FLWR_HOME
    FLWR_HOME="$(mktemp -d)"
    printf '[superlink]\ndefault = "target"\n[superlink.target]\naddress = "%s"\nroot-certificates = "%s"\n' \
      "$target" "$(cd "$DIR" && pwd)/ca.crt" > "$FLWR_HOME/config.toml"
    target=target
  fi
  deadline=$((SECONDS + wait_s))
  for pub in "${keys[@]}"; do
    name="$(basename "$pub" .pub)"
    while true; do
      out="$(flwr supernode register "$pub" "$target" --name "$name" --format json 2>&1 || true)"
      if grep -q '"success": true' <<<"$out"; then
        echo "registered $name ($(grep -o '"node-id": "\{0,1\}[0-9]*' <<<"$out" | tr -d '"'))"; break
      elif grep -q 'already in use' <<<"$out"; then
        echo "$name was registered before"; break
      elif ((SECONDS >= deadline)); then
        echo "make-certs.sh: registering $name failed: $out" >&2; exit 1
      fi
      sleep 2
    done
  done
}

san_list() {
  local out="DNS:localhost,IP:127.0.0.1,DNS:superlink,DNS:fleet-gateway" s
  for s in "${SANS[@]+"${SANS[@]}"}"; do
    if [[ $s =~ ^[0-9.]+$ || $s == *:* ]]; then out+=",IP:$s"; else out+=",DNS:$s"; fi
  done
  echo "$out"
}

make_ca_and_superlink() {
  need openssl
  mkdir -p "$DIR"
  if [[ $FORCE == 1 || ! -f $DIR/ca.crt ]]; then
    openssl req -x509 -newkey rsa:4096 -sha256 -days 3650 -nodes -subj "/CN=FedOwen CA" \
      -keyout "$DIR/ca.key" -out "$DIR/ca.crt" 2>/dev/null
    echo "wrote $DIR/ca.crt and $DIR/ca.key"
  fi
  if [[ $FORCE == 1 || ! -f $DIR/superlink.crt ]]; then
    local ext
    ext="$(mktemp)"
    printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' \
      "$(san_list)" > "$ext"
    openssl req -newkey rsa:4096 -sha256 -nodes -subj "/CN=superlink" \
      -keyout "$DIR/superlink.key" -out "$DIR/superlink.csr" 2>/dev/null
    openssl x509 -req -in "$DIR/superlink.csr" -CA "$DIR/ca.crt" -CAkey "$DIR/ca.key" \
      -CAcreateserial -days 825 -sha256 -extfile "$ext" -out "$DIR/superlink.crt" 2>/dev/null
    rm -f "$ext" "$DIR/superlink.csr" "$DIR/ca.srl"
    echo "wrote $DIR/superlink.crt ($(san_list)) and $DIR/superlink.key"
  fi
  chmod 600 "$DIR/ca.key" "$DIR/superlink.key"
}

make_node_keys() {
  need ssh-keygen
  mkdir -p "$DIR/supernodes"
  local i key
  for ((i = 0; i < NUM_NODES; i++)); do
    key="$DIR/supernodes/$PREFIX$i"
    if [[ $FORCE == 1 ]]; then rm -f "$key" "$key.pub"; fi
    if [[ ! -f $key ]]; then
      ssh-keygen -q -t ecdsa -b 384 -N "" -C "$PREFIX$i" -f "$key"
      echo "wrote $key and $key.pub"
    fi
  done
}

if [[ ${1:-} == register ]]; then
  shift
  ADDRESS="" WAIT=0
  while getopts "d:a:w:h" opt; do
    case $opt in d) DIR=$OPTARG ;; a) ADDRESS=$OPTARG ;; w) WAIT=$OPTARG ;; h) usage ;; *) usage 2 ;; esac
  done
  shift $((OPTIND - 1))
  if [[ -n $ADDRESS ]]; then [[ $# -eq 0 ]] || usage 2; register "$ADDRESS" "$WAIT"
  else [[ $# -eq 1 ]] || usage 2; register "$1" "$WAIT"; fi
  exit 0
fi

while getopts "d:n:p:s:fh" opt; do
  case $opt in
    d) DIR=$OPTARG ;;
    n) NUM_NODES=$OPTARG ;;
    p) PREFIX=$OPTARG ;;
    s) SANS+=("$OPTARG") ;;
    f) FORCE=1 ;;
    h) usage ;;
    *) usage 2 ;;
  esac
done
shift $((OPTIND - 1))
[[ $# -eq 0 ]] || usage 2
[[ $NUM_NODES =~ ^[0-9]+$ ]] || { echo "make-certs.sh: -n wants a count, got '$NUM_NODES'" >&2; exit 2; }
make_ca_and_superlink
make_node_keys
