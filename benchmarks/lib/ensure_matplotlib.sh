#!/usr/bin/env bash
# Print the path of a Python that can import matplotlib, installing matplotlib when needed:
#
#   py=$(bash benchmarks/lib/ensure_matplotlib.sh) && "$py" benchmarks/lib/plots.py ...
#
# Tried in order: $PLOT_PYTHON (if set), python3, then the virtualenv benchmarks/work/venv
# (MATPLOTLIB_VENV moves it; git-ignored), which is created with `python3 -m venv` and gets
# `pip install matplotlib` when it cannot import it. Where nothing works (the GPU machine has no
# network), it says so on stderr and exits 1: callers then skip the charts and keep the JSON
# lines and the table, from which the charts can be drawn later on a machine with PyPI access.
set -uo pipefail

venv="${MATPLOTLIB_VENV:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/work/venv}"

has_matplotlib() { "$1" -c 'import matplotlib' >/dev/null 2>&1; }

for py in "${PLOT_PYTHON:-}" "$(command -v python3)" "$venv/bin/python"; do
    if [[ -n "$py" ]] && has_matplotlib "$py"; then
        echo "$py"
        exit 0
    fi
done

echo "matplotlib: not importable; installing it into $venv" >&2
if { [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"; } >&2 &&
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --retries 1 \
        --timeout 15 matplotlib >&2 &&
    has_matplotlib "$venv/bin/python"; then
    echo "$venv/bin/python"
    exit 0
fi
echo "matplotlib: cannot import or install it (no network?)" >&2
exit 1
