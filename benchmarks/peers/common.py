"""Shared parts of the peer benchmarks (DGL and PyTorch Geometric on gnnpar's `dataset.h5`).

Everything here is independent of the GNN library: command-line options, reading gnnpar's
HDF5 v1 dataset, the metrics (accuracy, rank-based ROC-AUC), best-validation bookkeeping, and
the one JSON line each run prints. `dgl_bench.py` and `pyg_bench.py` import it.

Why this module must not import torch at the top: `setup_threads` sets `OMP_NUM_THREADS`
before torch and DGL load, so that DGL's OpenMP sampling and torch's kernels both use
`--threads` threads.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# The format version of gnnpar's dataset files that these scripts understand.
FORMAT_VERSION = 1

# Configurations of shared/peers/README.md; every one can be overridden on the command line.
SAGE_DEFAULTS = dict(epochs=3, hidden=256, layers=3, lr=0.003, dropout=0.5,
                     fanouts="15,10,5", batch_size=1024)
GCN_DEFAULTS = dict(epochs=200, hidden=256, layers=2, lr=0.01, dropout=0.5)


def log(msg: str) -> None:
    """Progress and diagnostics go to stderr; stdout carries only the final JSON line."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def fail(msg: str) -> "NoReturn":  # noqa: F821
    """Stop with a one-line error on stderr and exit status 1 (no traceback for bad input)."""
    print(f"error: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------

def parse_args(system: str, argv=None) -> argparse.Namespace:
    """Options shared by both systems; model-specific defaults are filled in after parsing."""
    p = argparse.ArgumentParser(
        description=f"{system}: GraphSAGE mini-batch or GCN full-batch on a gnnpar dataset.h5; "
                    "prints one JSON line with epoch times, peak RSS and the metric.")
    p.add_argument("--data", required=True, type=Path, help="gnnpar dataset.h5 (HDF5 v1)")
    p.add_argument("--model", choices=["sage", "gcn"], default="sage")
    p.add_argument("--epochs", type=int, help="epochs (default: sage 3, gcn 200)")
    p.add_argument("--threads", type=int, default=2, help="torch / OpenMP threads (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, help="hidden width (default 256)")
    p.add_argument("--layers", type=int, help="layers (default: sage 3, gcn 2)")
    p.add_argument("--lr", type=float, help="Adam learning rate (default: sage 0.003, gcn 0.01)")
    p.add_argument("--dropout", type=float, help="dropout between layers (default 0.5)")
    p.add_argument("--fanouts", help="sage: neighbours per hop from the seeds outward "
                                     "(default 15,10,5)")
    p.add_argument("--batch-size", type=int, help="sage: seeds per mini-batch (default 1024)")
    args = p.parse_args(argv)
    defaults = SAGE_DEFAULTS if args.model == "sage" else GCN_DEFAULTS
    for key, value in defaults.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    for key in ("epochs", "threads", "hidden", "layers"):
        if getattr(args, key) < 1:
            p.error(f"--{key} must be at least 1, got {getattr(args, key)}")
    if not 0.0 <= args.dropout < 1.0:
        p.error(f"--dropout must be in [0, 1), got {args.dropout}")
    if args.lr <= 0:
        p.error(f"--lr must be positive, got {args.lr}")
    if args.model == "sage":
        try:
            args.fanouts = [int(f) for f in str(args.fanouts).split(",")]
        except ValueError:
            p.error(f"--fanouts must be comma-separated integers, got {args.fanouts!r}")
        if any(f < 1 for f in args.fanouts):
            p.error(f"--fanouts must be positive, got {args.fanouts}")
        if len(args.fanouts) != args.layers:
            p.error(f"--fanouts has {len(args.fanouts)} entries but --layers is {args.layers} "
                    "(one fanout per layer)")
        if args.batch_size < 1:
            p.error(f"--batch-size must be at least 1, got {args.batch_size}")
    return args


def setup_threads(threads: int) -> None:
    """Pin OpenMP / MKL threads; call before importing torch or DGL."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    # DGL otherwise announces on every start that it assumes PyTorch.
    os.environ.setdefault("DGLBACKEND", "pytorch")


# ---------------------------------------------------------------------------------------------
# Reading gnnpar's dataset.h5
# ---------------------------------------------------------------------------------------------

@dataclass
class Graph:
    """A whole gnnpar dataset in memory, as numpy arrays."""
    name: str
    num_nodes: int
    num_classes: int
    indptr: np.ndarray      # int64, n + 1
    indices: np.ndarray     # int64, E: indices[indptr[v]:indptr[v+1]] send messages to v
    features: np.ndarray    # float32, n × d
    labels: np.ndarray      # int64, n
    train_idx: np.ndarray   # int64
    val_idx: np.ndarray
    test_idx: np.ndarray

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """(src, dst) of every stored edge: u -> v for each u in the list of v."""
        deg = np.diff(self.indptr)
        dst = np.repeat(np.arange(self.num_nodes, dtype=np.int64), deg)
        return self.indices, dst


def _attr(f, path: Path, name: str):
    if name not in f.attrs:
        fail(f"`{path}`: attribute `{name}` is missing (not a gnnpar dataset.h5?)")
    value = f.attrs[name]
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.reshape(()).item()
    return value


def _dataset(f, path: Path, name: str, ndim: int) -> np.ndarray:
    if name not in f:
        fail(f"`{path}`: dataset `{name}` is missing")
    arr = f[name][()]
    if arr.ndim != ndim:
        fail(f"`{path}`: dataset `{name}` has shape {arr.shape}, expected {ndim} dimension(s)")
    return arr


def load_dataset(path: Path) -> Graph:
    """Read and check a whole-graph gnnpar dataset.h5 (not a partition's part file).

    Errors name the file and the field and say what was expected; nothing is guessed.
    """
    import h5py

    if not path.is_file():
        fail(f"`{path}`: no such file")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        fail(f"`{path}`: cannot open as HDF5 ({e})")
    with f:
        version = int(_attr(f, path, "format_version"))
        if version != FORMAT_VERSION:
            fail(f"`{path}`: format_version {version}, these scripts read version "
                 f"{FORMAT_VERSION}")
        num_nodes = int(_attr(f, path, "num_nodes"))
        num_classes = int(_attr(f, path, "num_classes"))
        first_node = int(f.attrs.get("first_node", 0))
        if first_node != 0:
            fail(f"`{path}`: attribute `first_node` is {first_node}: this is one part of a "
                 "partitioned graph; give the whole dataset.h5")
        name = f.attrs.get("name", b"")
        if isinstance(name, bytes):
            name = name.decode("utf-8", "replace")
        name = str(name) or path.parent.name or path.stem
        indptr = _dataset(f, path, "indptr", 1).astype(np.int64)
        indices = _dataset(f, path, "indices", 1).astype(np.int64)
        if "features" not in f:
            fail(f"`{path}`: dataset `features` is missing (the peer models need features)")
        features = _dataset(f, path, "features", 2)
        if "labels" not in f:
            fail(f"`{path}`: dataset `labels` is missing")
        labels = f["labels"][()]
        if labels.ndim != 1:
            fail(f"`{path}`: dataset `labels` has shape {labels.shape}: multi-label data is not "
                 "supported by the peer scripts (expected one class per vertex)")
        splits = {}
        for key in ("train_idx", "val_idx", "test_idx"):
            splits[key] = (_dataset(f, path, key, 1).astype(np.int64) if key in f
                           else np.zeros(0, dtype=np.int64))

    if indptr.shape[0] != num_nodes + 1:
        fail(f"`{path}`: `indptr` has {indptr.shape[0]} entries, expected num_nodes + 1 = "
             f"{num_nodes + 1}")
    if indptr[0] != 0 or np.any(np.diff(indptr) < 0) or indptr[-1] != indices.shape[0]:
        fail(f"`{path}`: `indptr` must start at 0, never decrease and end at len(indices) = "
             f"{indices.shape[0]}")
    if indices.size and (indices.min() < 0 or indices.max() >= num_nodes):
        fail(f"`{path}`: `indices` holds ids outside 0..{num_nodes}")
    if features.shape[0] != num_nodes:
        fail(f"`{path}`: `features` has {features.shape[0]} rows, expected {num_nodes}")
    features = np.ascontiguousarray(features, dtype=np.float32)
    if labels.shape[0] != num_nodes:
        fail(f"`{path}`: `labels` has {labels.shape[0]} entries, expected {num_nodes}")
    labels = labels.astype(np.int64)
    if num_classes < 2:
        fail(f"`{path}`: attribute `num_classes` is {num_classes}, expected at least 2")
    for key, ids in splits.items():
        if ids.size and (ids.min() < 0 or ids.max() >= num_nodes):
            fail(f"`{path}`: `{key}` holds ids outside 0..{num_nodes}")
        bad = (labels[ids] < 0) | (labels[ids] >= num_classes)
        if bad.any():
            v = int(ids[np.argmax(bad)])
            fail(f"`{path}`: `labels[{v}]` = {labels[v]} (vertex in `{key}`) is outside "
                 f"0..{num_classes}")
    if splits["train_idx"].size == 0:
        fail(f"`{path}`: `train_idx` is missing or empty")
    return Graph(name=name, num_nodes=num_nodes, num_classes=num_classes, indptr=indptr,
                 indices=indices, features=features, labels=labels, **splits)


# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------

def metric_name(num_classes: int) -> str:
    """ROC-AUC for binary tasks (the heterophilous benchmark's metric), accuracy otherwise."""
    return "roc_auc" if num_classes == 2 else "accuracy"


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    if labels.size == 0:
        return math.nan
    return float((logits.argmax(axis=1) == labels).mean())


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve by ranks (Mann-Whitney U); tied scores share their mean rank.

    NaN when one class is absent (the AUC is undefined then).
    """
    scores = np.asarray(scores, dtype=np.float64)
    positive = np.asarray(labels) == 1
    n_pos = int(positive.sum())
    n_neg = positive.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    # Start index of each run of equal scores; every member of a run gets the run's mean rank.
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], scores.size]
    mean_rank = (starts + ends + 1) / 2.0  # ranks are 1-based: run covers starts+1 .. ends
    ranks = np.empty(scores.size, dtype=np.float64)
    ranks[order] = np.repeat(mean_rank, ends - starts)
    u = ranks[positive].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def evaluate(logits: np.ndarray, labels: np.ndarray, num_classes: int) -> float:
    """The task's metric on `logits` (rows × classes) against `labels`."""
    if num_classes == 2:
        # Score of the positive class: the logit difference orders vertices like its softmax.
        return roc_auc(logits[:, 1] - logits[:, 0], labels)
    return accuracy(logits, labels)


# ---------------------------------------------------------------------------------------------
# Bookkeeping and output
# ---------------------------------------------------------------------------------------------

@dataclass
class Run:
    """Per-epoch times and metrics of one run; `finish` prints the JSON line."""
    system: str
    version: str
    args: argparse.Namespace
    graph: Graph
    epoch_seconds: list = field(default_factory=list)
    sample_seconds: float = 0.0
    train_seconds: float = 0.0
    best_epoch: int = -1
    best_val: float = -math.inf
    best_test: float = math.nan
    losses: list = field(default_factory=list)

    def record_epoch(self, epoch: int, seconds: float, sample: float, train: float,
                     loss: float, val: float, test: float) -> None:
        self.epoch_seconds.append(seconds)
        self.sample_seconds += sample
        self.train_seconds += train
        self.losses.append(loss)
        # First epoch with the best validation metric wins (NaN never wins).
        if not math.isnan(val) and val > self.best_val:
            self.best_epoch, self.best_val, self.best_test = epoch, val, test
        log(f"epoch {epoch:3d}  {seconds:8.4f} s (sample {sample:.4f}, train {train:.4f})  "
            f"loss {loss:.4f}  val {val:.4f}  test {test:.4f}")

    def finish(self, extra: dict | None = None) -> None:
        def clean(x):
            return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x

        a = self.args
        out = {
            "system": self.system,
            "version": self.version,
            "dataset": self.graph.name,
            "model": a.model,
            "epochs": a.epochs,
            "epoch_seconds": [round(s, 6) for s in self.epoch_seconds],
            "epoch_time_median": round(float(np.median(self.epoch_seconds)), 6),
            "sample_seconds": round(self.sample_seconds, 6),
            "train_seconds": round(self.train_seconds, 6),
            # Linux reports ru_maxrss in KiB.
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "metric_name": metric_name(self.graph.num_classes),
            "val": clean(self.best_val if self.best_epoch >= 0 else None),
            "test": clean(self.best_test if self.best_epoch >= 0 else None),
            "best_epoch": self.best_epoch if self.best_epoch >= 0 else None,
            "final_loss": clean(self.losses[-1] if self.losses else None),
            "threads": a.threads,
            "seed": a.seed,
            "num_nodes": self.graph.num_nodes,
            "num_edges": self.graph.num_edges,
            "config": {k: getattr(a, k) for k in ("hidden", "layers", "lr", "dropout")}
            | ({"fanouts": a.fanouts, "batch_size": a.batch_size} if a.model == "sage" else {}),
        }
        if extra:
            out.update(extra)
        print(json.dumps(out), flush=True)


class Stopwatch:
    """Accumulates wall time over `with` blocks (time.perf_counter)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __enter__(self):
        self._t = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds += time.perf_counter() - self._t
        return False
