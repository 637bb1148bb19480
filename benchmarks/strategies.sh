#!/usr/bin/env bash
# Strategy comparison (issue 5, second benchmark): split vs DNP vs SNP vs GDP at 2 and 4 MPI
# ranks on Tolokers, Facebook and the 200k-vertex SBM graph, on METIS partitions, no cache;
# plus hybrid at 4 ranks as 2 pretend nodes × 2 ranks (`--ranks-per-node 2`, 2-part METIS
# partitions: every pretend node holds the whole graph).
# Records per run: epoch time and its breakdown (max over ranks), bytes per operation kind,
# feature bytes (GDP/DNP: `store_rows`; split: `split_features`; SNP: none, it moves partial
# rows of the hidden width, `snp_partials`), and split's per-layer imbalance and cross-split edge %.
#
# The strategies run back to back on each graph and rank count, so that they see similar load.
# A strategy that `gnnpar train` rejects as unknown is recorded as {"status": "not implemented"}
# with the program's error message.
#
#   benchmarks/strategies.sh                  # ~10-15 minutes on 2 loaded cores
#   DATASETS="facebook" benchmarks/strategies.sh
#
# Outputs: benchmarks/results/strategies.{jsonl,md}, strategies_{time,bytes}.{png,svg}.
# Inputs, step limits and environment knobs are those of gdp_scaling.sh (sourced below).
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=gdp_scaling.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/gdp_scaling.sh"

STRATEGIES="${STRATEGIES:-gdp split dnp snp hybrid}"

strategies_main() {
    prepare_inputs
    mkdir -p "$RESULTS_DIR"
    RESULTS_TMP="$RESULTS_DIR/.strategies.jsonl.tmp"
    : >"$RESULTS_TMP"
    local d r s
    for d in ${DATASETS:-$ALL_DATASETS}; do
        for r in 2 4; do
            for s in $STRATEGIES; do
                # hybrid on one node is split: it runs below on pretend nodes instead.
                [[ "$s" == hybrid ]] && continue
                run_one strategies "$d" "$s" "$r" 0
            done
        done
        if [[ " $STRATEGIES " == *" hybrid "* ]]; then
            run_one strategies "$d" hybrid 4 0 2
        fi
    done
    finish strategies "Strategies (GraphSAGE, inputs/sage-bench.toml, METIS parts)" --split
}

strategies_main "$@"
