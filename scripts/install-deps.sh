#!/usr/bin/env bash
# Installs the Debian 12 packages Clocher builds, tests and runs with, when any is missing.
# Idempotent: a machine that has them all runs no apt-get at all.
set -euo pipefail

pkgs=(
  build-essential cmake ninja-build pkg-config clang libclang-rt-14-dev
  libgrpc-dev protobuf-c-compiler libprotobuf-c-dev protobuf-compiler-grpc
  libuv1-dev libnuma-dev libzstd-dev libjansson-dev libcmocka-dev libsystemd-dev
  libpcre2-dev libutf8proc-dev libmicrohttpd-dev libcurl4-openssl-dev curl
  libyajl-dev
  python3-jinja2 python3-yaml nginx-light prometheus
  openssl python3 python3-grpcio python3-grpc-tools python3-numpy python3-pytest python3-prometheus-client
  systemd
)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing Debian packages: ${missing[*]} (run as root to install them)" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
