#!/usr/bin/env bash
# Install the system packages gnnpar builds and runs with (Debian/Ubuntu), only those missing.
set -euo pipefail
# g++: the CUDA emulator (src/backend/cuda/emu.rs) compiles cuda/*.cu for the CPU with it.
pkgs=(libopenmpi-dev openmpi-bin libhdf5-dev libclang-dev pkg-config cmake g++)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
