#!/usr/bin/env bash
# Strategy comparison (issue 5, second benchmark; NFP since issue 15): split vs DNP vs SNP vs NFP vs GDP at 2 and 4 MPI
# ranks (RANKS) on Tolokers, Facebook and the 200k-vertex SBM graph, on METIS partitions, no
# cache; plus hybrid at every rank count r ≥ 4 as 2 pretend nodes × r/2 ranks
# (`--ranks-per-node r/2`, r/2-part METIS partitions: every pretend node holds the whole graph).
# Records per run: epoch time and its breakdown (max over ranks), bytes per operation kind,
# feature bytes (GDP/DNP: `store_rows`; split: `split_features`; SNP: none, it moves partial
# rows of the hidden width, `snp_partials`; NFP: none, it moves the input blocks `nfp_blocks` and
# partial rows `nfp_partials` / their gradients `nfp_grads`, and reads the unpartitioned
# dataset.h5 instead of the METIS parts), and split's per-layer imbalance and cross-split edge %.
#
# The strategies run back to back on each graph and rank count, so that they see similar load.
# A strategy that `gnnpar train` rejects as unknown is recorded as {"status": "not implemented"}
# with the program's error message.
#
#   benchmarks/strategies.sh                  # ~10-15 minutes on 2 loaded cores
#   DATASETS="facebook" STRATEGIES="gdp split" benchmarks/strategies.sh
#   DEVICE=cuda RANKS="1 2 4 8" DATASETS=tolokers benchmarks/strategies.sh   # GPU scaling study
#   benchmarks/strategies.sh plot path/to/strategies_cuda.jsonl   # table + charts of earlier runs
#
# Outputs: $RESULTS/strategies.{jsonl,md}, strategies_{time,bytes}.{png,svg} (strategies_$DEVICE
# when DEVICE is not cpu). A strategy the device refuses is recorded as failed with its message.
# Inputs, step limits and environment knobs (RESULTS, APPEND, DATASETS, RANKS, DEVICE, GNNPAR,
# RUN_TIMEOUT, ...) are those of gdp_scaling.sh (sourced below); STRATEGIES picks a subset of
# "gdp split dnp snp nfp hybrid"; RANKS defaults to "2 4" here.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=gdp_scaling.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/gdp_scaling.sh"

STRATEGIES="${STRATEGIES:-gdp split dnp snp nfp hybrid}"
STRATEGIES_TITLE="Strategies (GraphSAGE, inputs/sage-bench.toml, METIS parts)"

# hybrid RANKS: whether hybrid runs at RANKS (2 pretend nodes of RANKS/2 ranks each).
hybrid_at() { (($1 >= 4 && $1 % 2 == 0)) && [[ " $STRATEGIES " == *" hybrid "* ]]; }

strategies_main() {
    local ranks="${RANKS:-2 4}" r parts=()
    for r in $ranks; do
        if ((r > 1)); then parts+=("$r"); fi
        if hybrid_at "$r"; then parts+=($((r / 2))); fi
    done
    # shellcheck disable=SC2046 # one part count per word
    prepare_inputs $(printf '%s\n' "${parts[@]}" | sort -nu)
    mkdir -p "$RESULTS_DIR"
    local name
    name=$(results_name strategies)
    RESULTS_TMP="$RESULTS_DIR/.$name.jsonl.tmp"
    : >"$RESULTS_TMP"
    local d s
    for d in ${DATASETS:-$ALL_DATASETS}; do
        for r in $ranks; do
            for s in $STRATEGIES; do
                # hybrid on one node is split: it runs below on pretend nodes instead.
                [[ "$s" == hybrid ]] && continue
                run_one strategies "$d" "$s" "$r" 0
            done
            if hybrid_at "$r"; then run_one strategies "$d" hybrid "$r" 0 $((r / 2)); fi
        done
    done
    finish "$name" "$STRATEGIES_TITLE" --split
}

dispatch strategies_main "$STRATEGIES_TITLE" --split -- "$@"
