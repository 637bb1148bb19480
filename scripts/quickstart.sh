#!/usr/bin/env bash
# The README's first command: install what is missing, build in release mode, and run the main
# job — GraphSAGE trained by 2 MPI ranks (data parallel) on a synthetic graph generated
# in-process. Outputs land in out/ (metrics.jsonl, summary.json, checkpoint.h5).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cargo build --release
if [ "$(id -u)" -eq 0 ]; then
  # Open MPI refuses to run as root unless told this is intended (containers, CI).
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
mkdir -p out
mpirun -np 2 --oversubscribe --bind-to none target/release/gnnpar train \
  --config inputs/synthetic.toml \
  --metrics out/metrics.jsonl --summary out/summary.json --checkpoint out/checkpoint.h5
