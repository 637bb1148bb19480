#!/usr/bin/env bash
# The README's second command (and what CI runs): install what is missing, then the whole
# test suite: cargo's tests, then the Slurm checks on a one-node cluster started here
# (scripts/slurm-test.sh). Cases that cannot run here (no real datasets in GNNPAR_DATA, no
# mpirun, no Slurm, no GPU) print SKIPPED and are recorded; the suite ends with their count,
# so a green run that skipped something does not look complete.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
mkdir -p target
export GNNPAR_SKIP_LOG=$PWD/target/skipped.tsv
: > "$GNNPAR_SKIP_LOG"

# NVRTC for the CUDA kernels' compile tests (tests/cuda_driver.rs): the PyPI wheel ships
# libnvrtc.so.12, which needs no GPU and no CUDA toolkit. Installed once under target/; a failed
# install only warns (those tests then say SKIPPED [gpu]; with the wheel present they must find it).
nvrtc_wheel=$PWD/target/nvrtc-wheel
if [ ! -e "$nvrtc_wheel/nvidia/cuda_nvrtc/lib/libnvrtc.so.12" ]; then
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$nvrtc_wheel" \
      nvidia-cuda-nvrtc-cu12==12.9.86 \
    || echo "warning: could not install the NVRTC wheel (nvidia-cuda-nvrtc-cu12); the CUDA compile tests will not find NVRTC" >&2
fi
export GNNPAR_NVRTC_DIR=$nvrtc_wheel/nvidia/cuda_nvrtc/lib

status=0
cargo test --release --all-targets -- --test-threads=2 || status=$?
if [ -x target/release/gnnpar ]; then
  bash scripts/slurm-test.sh || status=$?
else
  echo "slurm-test: not run, the build failed" >&2
  status=1
fi

echo
count() { awk -F'\t' -v k="$1" '$1 == k' "$GNNPAR_SKIP_LOG" | wc -l; }
echo "== skipped: real-data $(count real-data), MPI $(count mpi), Slurm $(count slurm)," \
     "GPU $(count gpu), other $(count other)"
sort "$GNNPAR_SKIP_LOG" | awk -F'\t' '{printf "   %-9s %s: %s\n", $1, $2, $3}'
[ "$status" -eq 0 ] && echo "== test suite passed" || echo "== test suite FAILED"
exit "$status"
