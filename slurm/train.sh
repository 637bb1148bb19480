#!/usr/bin/env bash
# Train gnnpar under Slurm: one MPI rank per task, rayon threads = cpus per task.
#
#   sbatch slurm/train.sh <data: dataset.h5 | parts/> <config.toml> [extra gnnpar train options]
#   sbatch --nodes=2 --ntasks-per-node=4 --cpus-per-task=8 slurm/train.sh parts/ inputs/tolokers.toml
#
# Launcher: srun by default; set GNNPAR_LAUNCHER=mpirun to use Open MPI's mpirun inside the
# allocation (it reads the Slurm allocation itself; no ssh is involved either way).
#SBATCH --job-name=gnnpar
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=4
#SBATCH --time=01:00:00
#SBATCH --output=%x-%j.out
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: sbatch slurm/train.sh <dataset.h5|parts/> <config.toml> [gnnpar train options]" >&2
  exit 2
fi
data=$1
config=$2
shift 2

bin=${GNNPAR_BIN:-$(dirname "$0")/../target/release/gnnpar}
if [ ! -x "$bin" ]; then
  echo "gnnpar binary not found at $bin (build with cargo build --release, or set GNNPAR_BIN)" >&2
  exit 2
fi

threads=${SLURM_CPUS_PER_TASK:-1}
export OMP_NUM_THREADS=$threads RAYON_NUM_THREADS=$threads
out_dir=${GNNPAR_OUT:-gnnpar-${SLURM_JOB_ID:-local}}
mkdir -p "$out_dir"

echo "gnnpar: job ${SLURM_JOB_ID:-?} on ${SLURM_JOB_NUM_NODES:-1} node(s), ${SLURM_NTASKS:-1} ranks, $threads threads per rank"
args=(train --data "$data" --config "$config" --threads "$threads"
      --metrics "$out_dir/metrics.jsonl" --summary "$out_dir/summary.json"
      --checkpoint "$out_dir/checkpoint.h5" "$@")

case "${GNNPAR_LAUNCHER:-srun}" in
  srun)
    # Slurm >= 22.05 no longer passes --cpus-per-task from sbatch to srun: repeat it.
    srun --cpus-per-task="$threads" --cpu-bind=cores "$bin" "${args[@]}"
    ;;
  mpirun)
    mpirun --map-by "ppr:${SLURM_NTASKS_PER_NODE:-1}:node:PE=$threads" --bind-to core "$bin" "${args[@]}"
    ;;
  *)
    echo "unknown GNNPAR_LAUNCHER=${GNNPAR_LAUNCHER} (srun or mpirun)" >&2
    exit 2
    ;;
esac
