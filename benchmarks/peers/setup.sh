#!/usr/bin/env bash
# Creates the virtualenv for the peer benchmarks (DGL and PyTorch Geometric on CPU) and installs
# the versions pinned in shared/peers/README.md. Idempotent: a package already installed at the
# pinned version is skipped, so re-running after a failure resumes where it stopped.
#
#   benchmarks/peers/setup.sh            # venv in benchmarks/peers/.venv
#   PEERS_VENV=/some/dir setup.sh        # venv elsewhere
#   PEERS_SKIP_COMPILED=1 setup.sh       # skip torch_scatter/torch_sparse (PyG SAGE then cannot sample)
#
# torch_scatter and torch_sparse come from PyPI as source and compile for ~12 minutes on two
# cores; they are installed last, so DGL and PyG's GCN are usable before they finish.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${PEERS_VENV:-$here/.venv}"
python="${PYTHON:-python3}"

log() { echo "[peers setup $(date +%H:%M:%S)] $*" >&2; }

if [[ ! -x "$venv/bin/python" ]]; then
    log "creating virtualenv $venv"
    "$python" -m venv "$venv"
fi
py="$venv/bin/python"
pip=("$py" -m pip --disable-pip-version-check)

# installed NAME VERSION: true when the distribution NAME is installed at exactly VERSION
# (VERSION empty: any version). Uses importlib.metadata, so nothing is imported.
installed() {
    "$py" - "$1" "${2:-}" <<'PY'
import sys
from importlib import metadata
name, want = sys.argv[1], sys.argv[2]
try:
    have = metadata.version(name)
except metadata.PackageNotFoundError:
    sys.exit(1)
# Local version tags (e.g. "2.2.1+cpu") count as the same release.
sys.exit(0 if not want or have.split("+")[0] == want else 1)
PY
}

# need NAME VERSION [pip args...]: installs NAME==VERSION unless installed already.
need() {
    local name="$1" version="$2"
    shift 2
    if installed "$name" "$version"; then
        log "ok: $name ${version:-(any version)}"
        return 0
    fi
    local spec="$name"
    [[ -n "$version" ]] && spec="$name==$version"
    log "installing $spec $*"
    "${pip[@]}" install "$spec" "$@"
}

# Build tooling for the source packages (--no-build-isolation uses the venv's own).
need wheel ""
need setuptools ""

# numpy<2: torch 2.2 was built against numpy 1.x.
if ! "$py" -c 'import numpy, sys; sys.exit(0 if numpy.__version__.startswith("1.") else 1)' 2>/dev/null; then
    log "installing numpy<2"
    "${pip[@]}" install 'numpy<2'
else
    log "ok: numpy 1.x"
fi

# The PyPI wheel (it pulls the CUDA runtime packages but runs on CPU); DGL's CPU wheels need a
# torch of this era.
need torch 2.2.1 'numpy<2'
need dgl 2.1.0 'numpy<2'
# --no-deps: newer torchdata removed `datapipes`, which DGL imports; its own deps would move torch.
need torchdata 0.7.1 --no-deps
# DGL needs these but does not declare them.
if ! "$py" -c 'import pandas, sys; sys.exit(0 if int(pandas.__version__.split(".")[0]) < 3 else 1)' 2>/dev/null; then
    log "installing pandas<3"
    "${pip[@]}" install 'pandas<3' 'numpy<2'
else
    log "ok: pandas<3"
fi
need pyyaml ""
need pydantic ""
need h5py "" 'numpy<2'
need psutil ""
need torch_geometric 2.6.1 'numpy<2'

if [[ "${PEERS_SKIP_COMPILED:-0}" == 1 ]]; then
    log "PEERS_SKIP_COMPILED=1: not building torch_scatter / torch_sparse"
else
    # Source builds against the venv's torch; MAX_JOBS=2 keeps the compiler within two cores.
    export MAX_JOBS="${MAX_JOBS:-2}"
    need torch_scatter 2.1.2 --no-build-isolation
    need torch_sparse 0.6.18 --no-build-isolation
fi

# Check that everything imports together (DGL's import is where a wrong pin shows up).
"$py" - <<'PY'
import importlib
for mod in ["numpy", "torch", "dgl", "torch_geometric", "h5py", "psutil"]:
    m = importlib.import_module(mod)
    print(f"{mod} {getattr(m, '__version__', '?')}")
for mod in ["torch_scatter", "torch_sparse"]:
    try:
        m = importlib.import_module(mod)
        print(f"{mod} {m.__version__}")
    except ImportError as e:
        print(f"{mod} not available ({e}): PyG SAGE cannot sample neighbours")
PY
log "done: $venv"
