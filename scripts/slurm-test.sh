#!/usr/bin/env bash
# The README's Slurm section under a real Slurm: install slurm-wlm and munge when missing, start
# a one-node cluster on this machine (munged, slurmctld, slurmd in a private directory, on free
# ports, stopped by PID on exit), and run what a new cluster user runs:
#   1. the README's marked Slurm lines, literally (2 tasks → one summary with "ranks":2);
#   2. GNNPAR_LAUNCHER=mpirun, submitted without Open MPI's root override in the environment
#      (as root it passes only if train.sh sets the override itself);
#   3. a partition of 3 parts on 2 tasks: refused, suggesting srun, not mpirun;
#   4. srun with Slurm's default MpiDefault=none (the cluster runs with it): two unconnected
#      tasks must fail loudly instead of training twice;
#   5. kill -9 of one rank mid-run: the job ends within a bound, its checkpoint resumes;
#   6. `gnnpar info` of one dataset file under srun: refused, the hint naming srun.
# Called by scripts/test.sh after cargo's tests; needs target/release/gnnpar. Where Slurm cannot
# be installed or started, it prints a SKIPPED line (and records it in GNNPAR_SKIP_LOG) and
# exits 0; any failed check exits 1.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$ROOT/target/release/gnnpar
TIMEOUT=${SLURM_TEST_TIMEOUT:-180}   # seconds any one job may take

say() { printf 'slurm-test: %s\n' "$*"; }
skip() {
  say "SKIPPED [slurm]: $*"
  if [ -n "${GNNPAR_SKIP_LOG:-}" ]; then
    printf 'slurm\tscripts/slurm-test.sh\t%s\n' "$*" >> "$GNNPAR_SKIP_LOG"
  fi
  exit 0
}
failures=0
check() {  # check <description> <command...>: run the command, count a failure
  local what=$1; shift
  if "$@"; then say "ok: $what"; else say "FAILED: $what"; failures=$((failures + 1)); fi
}

[ -x "$BIN" ] || { say "no $BIN: build with cargo build --release first"; exit 1; }

# --- install -------------------------------------------------------------------------------
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if sudo -n true 2>/dev/null; then SUDO="sudo -n"; else skip "not root and no passwordless sudo: cannot run Slurm's daemons"; fi
fi
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
  say "installing slurm-wlm and munge"
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
      --no-install-recommends slurm-wlm munge; } >/dev/null 2>&1 \
    || skip "apt-get install slurm-wlm munge failed"
fi

# --- a one-node cluster in a private directory -----------------------------------------------
T=$(mktemp -d /tmp/gnnpar-slurm.XXXXXX)
chmod 755 "$T"
stop_cluster() {
  # Jobs first (their slurmstepd would hold slurmd's shutdown), then the daemons by PID:
  # SIGTERM, up to 10 s to exit, then SIGKILL.
  [ -s "$T/slurmctld.pid" ] && scancel --quiet --user="$(id -un)" 2>/dev/null
  local pids=() p
  for pidfile in "$T/slurmd.pid" "$T/slurmctld.pid" "$T/munge/pid"; do
    [ -s "$pidfile" ] && pids+=("$(cat "$pidfile")")
  done
  for _ in $(seq 20); do
    [ -z "$(squeue -h 2>/dev/null)" ] && break
    sleep 0.5
  done
  [ ${#pids[@]} -gt 0 ] && $SUDO kill "${pids[@]}" 2>/dev/null
  for _ in $(seq 20); do
    local alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.5
  done
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && $SUDO kill -9 "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do
    for _ in $(seq 20); do kill -0 "$p" 2>/dev/null || break; sleep 0.25; done
  done
  $SUDO rm -rf "$T"
}
trap stop_cluster EXIT
show_logs() { tail -n 30 "$T"/log/*.log "$T"/munge/log 2>/dev/null | sed 's/^/    /'; }

mkdir -p "$T"/{state,spool,log,munge,work}
head -c 1024 /dev/urandom > "$T/munge/munge.key"; chmod 600 "$T/munge/munge.key"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
host=$(hostname -s)
cat > "$T/slurm.conf" <<EOF
ClusterName=gnnpartest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$T/munge/socket
SlurmUser=$(id -un)
SlurmdUser=root
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# Slurm's own default: srun connects no MPI unless told (slurm/train.sh says --mpi=pmix).
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
MinJobAge=600
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
export SLURM_CONF=$T/slurm.conf

# The daemons are started without Open MPI's root override (scripts/test.sh exports it), so
# that no job can inherit it from them: check 2 needs train.sh to set it.
unset OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
$SUDO munged --force --socket="$T/munge/socket" --key-file="$T/munge/munge.key" \
  --pid-file="$T/munge/pid" --log-file="$T/munge/log" --seed-file="$T/munge/seed" \
  || { show_logs; skip "munged did not start"; }
$SUDO env SLURM_CONF="$SLURM_CONF" slurmctld -f "$SLURM_CONF" || { show_logs; skip "slurmctld did not start"; }
$SUDO env SLURM_CONF="$SLURM_CONF" slurmd -f "$SLURM_CONF" || { show_logs; skip "slurmd did not start"; }
for _ in $(seq 60); do
  state=$(sinfo -h -o %T 2>/dev/null | head -n 1)
  [ "$state" = idle ] && break
  sleep 0.5
done
[ "${state:-}" = idle ] || { show_logs; skip "the node did not become idle (state: ${state:-none})"; }
say "cluster up: $(sinfo -h -o '%P %D node(s) %c CPUs %T') (Slurm $(sinfo -V | awk '{print $2}'))"

# The submit directory looks like the project: its slurm/, inputs/ and target/.
W=$T/work
ln -s "$ROOT/slurm" "$W/slurm"; ln -s "$ROOT/inputs" "$W/inputs"; ln -s "$ROOT/target" "$W/target"
cd "$W" || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 HDF5_USE_FILE_LOCKING=FALSE

# The job's output file of `sbatch … --parsable` job id $1.
job_out() { ls "$W"/*-"$1".out 2>/dev/null | head -n 1; }
# Submit and wait: sbatch_wait <sbatch args…>; prints the job id; exit status is the job's.
sbatch_wait() { timeout "$TIMEOUT" sbatch --parsable --wait "$@"; }

# --- 1. the README, literally ----------------------------------------------------------------
lines=$(awk '/<!-- slurm-test:begin -->/{on=1; next} /<!-- slurm-test:end -->/{on=0} on' "$ROOT/README.md" \
        | grep -v '^```' | grep -v '^[[:space:]]*#' | grep -v '^[[:space:]]*$')
[ -n "$lines" ] || { say "FAILED: no <!-- slurm-test:begin --> block in README.md"; exit 1; }
say "running the README's Slurm lines:"; printf '%s\n' "$lines" | sed 's/^/    $ /'
readme_ok() {
  ( set -e; eval "$lines" ) > "$T/readme.log" 2>&1 || { cat "$T/readme.log"; return 1; }
  local summaries; summaries=$(ls "$W"/gnnpar-*/summary.json 2>/dev/null)
  [ "$(printf '%s\n' "$summaries" | grep -c .)" = 1 ] || { echo "summaries: $summaries"; return 1; }
  grep -q '"ranks": 2' "$summaries" || { cat "$summaries"; return 1; }
  local out; out=$(ls "$W"/gnnpar-*.out)
  # One summary line on stdout (rank 0's), none of a lone rank.
  [ "$(grep -c '"ranks":2' "$out")" = 1 ] && ! grep -q '"ranks":1' "$out" || { cat "$out"; return 1; }
}
check "README: sbatch slurm/train.sh on 2 tasks trains one job with \"ranks\":2" readme_ok
data=$(ls -d "$W"/*-2/ 2>/dev/null | head -n 1)   # the README's 2-part partition
[ -n "$data" ] || { say "FAILED: the README's lines made no 2-part partition"; exit 1; }
dataset=$(ls "$W"/*.h5 | head -n 1)

# --- 2. mpirun inside the allocation, as root ------------------------------------------------
# This script and scripts/test.sh export Open MPI's root override, and sbatch passes the
# submitter's environment to the job: submitted with it, the check would pass whether or not
# train.sh sets the override. So the job is submitted without it (and the daemons were started
# without it), and a probe job first shows that it does not reach a job from elsewhere.
no_override() { env -u OMPI_ALLOW_RUN_AS_ROOT -u OMPI_ALLOW_RUN_AS_ROOT_CONFIRM "$@"; }
mpirun_ok() {
  local probe; probe=$(no_override timeout "$TIMEOUT" sbatch --parsable --wait --ntasks=1 \
    --output="$W/probe-%j.out" \
    --wrap 'echo "override=${OMPI_ALLOW_RUN_AS_ROOT:-unset},${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-unset}"')
  grep -qx 'override=unset,unset' "$W/probe-$probe.out" \
    || { echo "the override reaches jobs without train.sh:"; cat "$W/probe-$probe.out"; return 1; }
  local id; id=$(no_override GNNPAR_LAUNCHER=mpirun GNNPAR_OUT=$W/mpirun-out timeout "$TIMEOUT" \
    sbatch --parsable --wait --ntasks=2 --cpus-per-task=1 slurm/train.sh "$data" \
    inputs/synthetic.toml --epochs 1) || { cat "$(job_out "$id")"; return 1; }
  grep -q '"ranks": 2' "$W/mpirun-out/summary.json" || { cat "$(job_out "$id")"; return 1; }
}
if [ "$(id -u)" -eq 0 ]; then
  check "GNNPAR_LAUNCHER=mpirun as root, submitted without Open MPI's root override: train.sh sets it, \"ranks\":2" mpirun_ok
else
  check "GNNPAR_LAUNCHER=mpirun trains with \"ranks\":2" mpirun_ok
fi

# --- 3. parts ≠ tasks ------------------------------------------------------------------------
"$BIN" partition "$dataset" --parts 3 -o "$W/three/" > /dev/null 2>&1
mismatch_refused() {
  local id; id=$(GNNPAR_OUT=$W/mismatch sbatch_wait --ntasks=2 --cpus-per-task=1 \
    slurm/train.sh "$W/three/" inputs/synthetic.toml)
  local rc=$? out; out=$(job_out "$id")
  [ "$rc" -ne 0 ] || { echo "the job succeeded"; cat "$out"; return 1; }
  grep -q 'has 3 parts but the job has 2 ranks' "$out" && grep -q 'srun --mpi=pmix --ntasks=3' "$out" \
    && ! grep -q 'mpirun -np' "$out" || { cat "$out"; return 1; }
}
check "3 parts on 2 tasks: refused, suggesting srun --ntasks=3" mismatch_refused

# --- 4. srun under MpiDefault=none -----------------------------------------------------------
unconnected_refused() {
  local id; id=$(sbatch_wait --ntasks=2 --cpus-per-task=1 --output="$W/nompi-%j.out" \
    --wrap "srun $BIN train --data $data --config inputs/synthetic.toml --epochs 1 --summary $W/nompi.json")
  local rc=$? out="$W/nompi-$id.out"
  [ "$rc" -ne 0 ] || { echo "the job succeeded"; cat "$out"; return 1; }
  grep -q '2 tasks, but MPI sees a world of 1' "$out" && grep -q -- '--mpi=pmix' "$out" \
    && [ ! -e "$W/nompi.json" ] && ! grep -q '"ranks":1' "$out" || { cat "$out"; return 1; }
}
check "srun without an MPI plugin (MpiDefault=none): fails loudly, trains nothing" unconnected_refused

# --- 5. kill -9 of one rank ------------------------------------------------------------------
killed_job_ends() {
  local out_dir=$W/killed id
  id=$(GNNPAR_OUT=$out_dir sbatch --parsable --ntasks=2 --cpus-per-task=1 slurm/train.sh "$data" \
    inputs/synthetic.toml --epochs 2000 --batch-size 64 --eval-every 0 --checkpoint-every 1)
  local waited=0
  until [ -s "$out_dir/checkpoint.h5" ] && [ "$(squeue -h -j "$id" -o %T)" = RUNNING ]; do
    sleep 0.5; waited=$((waited + 1))
    [ "$waited" -lt $((TIMEOUT * 2)) ] || { echo "no checkpoint"; scancel "$id"; return 1; }
  done
  sleep 1
  # A rank, not the srun that started it: the ranks' command lines start with the binary.
  local victim; victim=$(pgrep -f "^[^ ]*/gnnpar train .*$out_dir/metrics.jsonl" | tail -n 1)
  [ -n "$victim" ] || { echo "no rank found"; scancel "$id"; return 1; }
  kill -9 "$victim"
  local t=0
  while [ -n "$(squeue -h -j "$id" 2>/dev/null)" ]; do
    sleep 0.5; t=$((t + 1))
    [ "$t" -lt 60 ] || { echo "job $id still running 30 s after a rank was killed"; scancel "$id"; return 1; }
  done
  local state; state=$(scontrol show job "$id" | grep -o 'JobState=[A-Z_]*')
  [ "$state" != JobState=COMPLETED ] || { echo "a killed job reported $state"; return 1; }
  say "  job $id ended $((t / 2)) s after kill -9 of rank pid $victim ($state)"
  # The checkpoint is whole and resumes: read its epoch E, then train epoch E from it.
  local resume=("$BIN" train --data "$data" --config inputs/synthetic.toml --batch-size 64
                --eval-every 0 --checkpoint "$out_dir/checkpoint.h5" --resume)
  local ep; ep=$("${resume[@]}" --epochs 1 2>&1 | grep -o 'resumed from .* at epoch [0-9]*' | grep -o '[0-9]*$')
  [ -n "$ep" ] || { echo "the checkpoint did not resume"; return 1; }
  "${resume[@]}" --epochs $((ep + 1)) > "$T/resume.log" 2>&1 && grep -q "epoch $ep: loss" "$T/resume.log" \
    || { echo "training epoch $ep from the checkpoint failed"; cat "$T/resume.log"; return 1; }
  say "  the checkpoint (epoch $ep) resumed and trained epoch $ep"
}
check "kill -9 of one rank ends the Slurm job; its checkpoint resumes" killed_job_ends

# --- 6. info on one file under srun names srun ----------------------------------------------
info_names_srun() {
  local id; id=$(sbatch_wait --ntasks=2 --cpus-per-task=1 --output="$W/info-%j.out" \
    --wrap "srun --mpi=pmix $BIN info $dataset")
  local rc=$? out="$W/info-$id.out"
  [ "$rc" -ne 0 ] || { echo "the job succeeded"; cat "$out"; return 1; }
  grep -q 'run `gnnpar info` on it as one process, not under srun' "$out" \
    && ! grep -q 'under mpirun' "$out" || { cat "$out"; return 1; }
}
check "gnnpar info on one dataset file under srun: refused, naming srun" info_names_srun

if [ "$failures" -gt 0 ]; then
  say "$failures check(s) failed; cluster logs:"; show_logs
  exit 1
fi
say "all Slurm checks passed"
