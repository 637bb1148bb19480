#!/usr/bin/env bash
# Train gnnpar under Slurm: one MPI rank per task, rayon threads = CPUs per task.
#
#   sbatch [sbatch options] slurm/train.sh <data: dataset.h5 | parts/> <config.toml> [gnnpar train options]
#   sbatch --nodes=2 --ntasks-per-node=4 --cpus-per-task=8 slurm/train.sh parts/ inputs/tolokers.toml
#
# Submit from the project directory. Under sbatch, $0 is Slurm's copy of this script in
# slurmd's spool directory, so the binary is looked for, first match wins, at
#   1. $GNNPAR_BIN                                (when set, the only place: an error if missing)
#   2. $SLURM_SUBMIT_DIR/target/release/gnnpar   (cargo build --release in the submit directory)
#   3. gnnpar on PATH                              (cargo install, or a site module)
#   4. this script's ../target/release/gnnpar     (bash slurm/train.sh inside salloc)
#
# Launcher (GNNPAR_LAUNCHER):
#   srun (default)  srun --mpi=$GNNPAR_SRUN_MPI (default pmix: Open MPI and MPICH built with
#                   PMIx; use pmi2 where the site's MPI needs it, `srun --mpi=list` shows them).
#                   Always named: with Slurm's default MpiDefault=none the tasks would not form
#                   one MPI job. --kill-on-bad-exit ends every task when one fails.
#   mpirun          Open MPI's mpirun inside the allocation (it reads the allocation itself).
#                   As root, the override Open MPI demands is set (containers, CI).
# The job's CPUs per task (and GPUs per task, when requested) are passed to the step: since
# Slurm 22.05, srun no longer inherits --cpus-per-task from sbatch.
#
# Outputs: $GNNPAR_OUT (default gnnpar-<job id>)/{metrics.jsonl,summary.json,checkpoint.h5};
# set GNNPAR_OUT to a fixed directory and pass --resume to continue in a later job.
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

# A binary is an executable regular file.
is_bin() { [ -f "$1" ] && [ -x "$1" ]; }
if [ -n "${GNNPAR_BIN:-}" ]; then
  # Named explicitly: used as given, never replaced by a binary found elsewhere.
  bin=$GNNPAR_BIN
  if ! is_bin "$bin"; then
    {
      echo "gnnpar binary not found: GNNPAR_BIN=$GNNPAR_BIN is not an executable file."
      echo "Only GNNPAR_BIN was checked: when it is set, no other place is looked at."
      echo "Point GNNPAR_BIN at the binary, or unset it to search the submit directory's" \
           "target/release/gnnpar, then PATH."
    } >&2
    exit 2
  fi
else
  script_bin="$(cd "$(dirname "$0")" && pwd)/../target/release/gnnpar"
  if [ -n "${SLURM_SUBMIT_DIR:-}" ] && is_bin "$SLURM_SUBMIT_DIR/target/release/gnnpar"; then
    bin=$SLURM_SUBMIT_DIR/target/release/gnnpar
  elif path_bin=$(command -v gnnpar 2>/dev/null) && is_bin "$path_bin"; then
    bin=$path_bin
  else
    bin=$script_bin
  fi
  if ! is_bin "$bin"; then
    {
      echo "gnnpar binary not found. Looked at, in order:"
      echo "  GNNPAR_BIN (unset)"
      if [ -n "${SLURM_SUBMIT_DIR:-}" ]; then
        echo "  $SLURM_SUBMIT_DIR/target/release/gnnpar"
      else
        echo "  \$SLURM_SUBMIT_DIR/target/release/gnnpar (SLURM_SUBMIT_DIR unset)"
      fi
      echo "  gnnpar on PATH"
      echo "  $script_bin"
      echo "Run cargo build --release in the directory you submit from, or set GNNPAR_BIN."
    } >&2
    exit 2
  fi
fi

threads=${SLURM_CPUS_PER_TASK:-1}
export OMP_NUM_THREADS=$threads RAYON_NUM_THREADS=$threads
out_dir=${GNNPAR_OUT:-gnnpar-${SLURM_JOB_ID:-local}}
mkdir -p "$out_dir"
launcher=${GNNPAR_LAUNCHER:-srun}

echo "gnnpar: job ${SLURM_JOB_ID:-?} on ${SLURM_JOB_NUM_NODES:-1} node(s), ${SLURM_NTASKS:-1} ranks," \
     "$threads threads per rank, binary $bin, launcher $launcher, outputs in $out_dir"
args=(train --data "$data" --config "$config" --threads "$threads"
      --metrics "$out_dir/metrics.jsonl" --summary "$out_dir/summary.json"
      --checkpoint "$out_dir/checkpoint.h5" "$@")

case "$launcher" in
  srun)
    step=(--mpi="${GNNPAR_SRUN_MPI:-pmix}" --kill-on-bad-exit=1
          --cpus-per-task="$threads" --cpu-bind=cores)
    [ -n "${SLURM_GPUS_PER_TASK:-}" ] && step+=(--gpus-per-task="$SLURM_GPUS_PER_TASK")
    exec srun "${step[@]}" "$bin" "${args[@]}"
    ;;
  mpirun)
    if [ "$(id -u)" -eq 0 ]; then
      # Open MPI refuses to run as root unless told this is intended.
      export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    fi
    if [ -n "${SLURM_NTASKS_PER_NODE:-}" ]; then
      map="ppr:${SLURM_NTASKS_PER_NODE%%(*}:node:PE=$threads"   # "4(x2)" → 4
    else
      map="slot:PE=$threads"
    fi
    exec mpirun -np "${SLURM_NTASKS:-1}" --map-by "$map" --bind-to core "$bin" "${args[@]}"
    ;;
  *)
    echo "unknown GNNPAR_LAUNCHER=$launcher (srun or mpirun)" >&2
    exit 2
    ;;
esac
