#!/usr/bin/env bash
# The README's second command (and what CI runs): install what is missing, then the whole
# test suite. Tests that need the real datasets read GNNPAR_DATA (default ../shared/datasets)
# and say SKIPPED loudly when they are absent.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
cargo test --release --all-targets -- --test-threads=2
