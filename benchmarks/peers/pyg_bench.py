#!/usr/bin/env python3
"""PyTorch Geometric peer benchmark: GraphSAGE mini-batch or GCN full-batch on a gnnpar dataset.h5.

    .venv/bin/python pyg_bench.py --data dataset.h5 --model sage [--epochs 3] [--threads 2]
    .venv/bin/python pyg_bench.py --data dataset.h5 --model gcn  [--epochs 200]

Prints one JSON line on stdout (see README.md); logs go to stderr.

* sage: 3 x SAGEConv(aggr='mean'), hidden 256, ReLU and dropout 0.5 between layers;
  NeighborLoader with fanouts 15,10,5 from the seeds outward (PyG's own convention), batch 1024
  seeds, all training vertices once per epoch, shuffled; Adam lr 0.003. Every layer runs on the
  whole sampled subgraph and the loss takes the seeds' rows (PyG's standard form). Neighbour
  sampling needs torch_sparse or pyg-lib (setup.sh builds torch_sparse; pyg-lib is not on PyPI).
  Only pyg-lib reports per-hop counts: with it, each layer is trimmed to the hops it still needs
  (`trim_to_layer`), which gives the seeds the same outputs with less work.
* gcn: 2 x GCNConv (symmetric normalisation, self-loops added where missing, normalisation
  cached), hidden 256, ReLU and dropout 0.5 between layers, Adam lr 0.01, on a torch CSR
  adjacency (`adj_t`, rows = receiving vertex), which is gnnpar's CSR as stored.

Evaluation (every epoch, not counted in the epoch time) runs the model on the whole graph with
all neighbours (CSR adjacency, no sampling, dropout off) and reports the metric at the
best-validation epoch.
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

ARGS = common.parse_args("PyG")
common.setup_threads(ARGS.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch_geometric  # noqa: E402
import torch_geometric.typing as pyg_typing  # noqa: E402
from torch_geometric.data import Data  # noqa: E402
from torch_geometric.nn import GCNConv, SAGEConv  # noqa: E402
from torch_geometric.utils import trim_to_layer  # noqa: E402


class Stack(nn.Module):
    """`layers` graph convolutions with ReLU and dropout between them (none after the last)."""

    def __init__(self, make_conv, dims: list[int], dropout: float):
        super().__init__()
        self.convs = nn.ModuleList(make_conv(dims[i], dims[i + 1]) for i in range(len(dims) - 1))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, edge_index, num_sampled_nodes=None, num_sampled_edges=None):
        """`edge_index`: a sampled subgraph's edge_index (with its per-hop counts, so each layer
        can drop the hops it no longer needs) or the whole graph's sparse adjacency."""
        last = len(self.convs) - 1
        for i, conv in enumerate(self.convs):
            if num_sampled_nodes is not None:
                x, edge_index, _ = trim_to_layer(
                    layer=i, num_sampled_nodes_per_hop=num_sampled_nodes,
                    num_sampled_edges_per_hop=num_sampled_edges, x=x, edge_index=edge_index)
            x = conv(x, edge_index)
            if i < last:
                x = self.dropout(F.relu(x))
        return x


def csr_adjacency(data: common.Graph, drop_self_loops: bool = False) -> torch.Tensor:
    """gnnpar's CSR as PyG's `adj_t`: row v lists the vertices whose messages v receives.

    `drop_self_loops`: for GCN, whose normalisation on a torch sparse tensor adds a self-loop
    to every vertex even where one exists; dropping them first gives A + I, as DGL gets.
    """
    indptr, indices = data.indptr, data.indices
    if drop_self_loops:
        rows = np.repeat(np.arange(data.num_nodes, dtype=np.int64), np.diff(indptr))
        keep = indices != rows
        if not keep.all():
            indices = indices[keep]
            indptr = np.zeros_like(indptr)
            np.cumsum(np.bincount(rows[keep], minlength=data.num_nodes), out=indptr[1:])
    with warnings.catch_warnings():
        # torch 2.2 calls its sparse CSR support "beta" on every construction.
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(
            torch.from_numpy(indptr), torch.from_numpy(indices),
            torch.ones(indices.shape[0], dtype=torch.float32),
            size=(data.num_nodes, data.num_nodes))


def evaluate_full(model, adj_t, x, data: common.Graph) -> tuple[float, float]:
    model.eval()
    with torch.no_grad():
        logits = model(x, adj_t).numpy()
    model.train()
    return (common.evaluate(logits[data.val_idx], data.labels[data.val_idx], data.num_classes),
            common.evaluate(logits[data.test_idx], data.labels[data.test_idx], data.num_classes))


def train_sage(args, data: common.Graph, run: common.Run) -> None:
    if not (pyg_typing.WITH_PYG_LIB or pyg_typing.WITH_TORCH_SPARSE):
        common.fail("PyG's neighbour sampling needs torch_sparse or pyg-lib, and neither "
                    "imports here: run benchmarks/peers/setup.sh (it builds torch_sparse)")
    from torch_geometric.loader import NeighborLoader

    src, dst = data.edges()
    x = torch.from_numpy(data.features)
    graph = Data(x=x, y=torch.from_numpy(data.labels),
                 edge_index=torch.from_numpy(np.stack([src, dst])), num_nodes=data.num_nodes)
    loader = NeighborLoader(graph, num_neighbors=args.fanouts, batch_size=args.batch_size,
                            input_nodes=torch.from_numpy(data.train_idx), shuffle=True,
                            drop_last=False, num_workers=0)
    adj_t = csr_adjacency(data)
    dims = [x.shape[1]] + [args.hidden] * (args.layers - 1) + [data.num_classes]
    model = Stack(lambda i, o: SAGEConv(i, o, aggr="mean"), dims, args.dropout)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        model.train()
        sample_t, train_t = common.Stopwatch(), common.Stopwatch()
        total_loss, batches = 0.0, 0
        t0 = time.perf_counter()
        batches_iter = iter(loader)
        while True:
            # Sampling time covers the loader: sampling, relabelling, and slicing features and
            # labels of the sampled vertices out of host memory.
            with sample_t:
                try:
                    batch = next(batches_iter)
                except StopIteration:
                    break
            with train_t:
                # Per-hop counts exist only with pyg-lib's sampler (None-less attributes are
                # absent otherwise); without them no trimming.
                out = model(batch.x, batch.edge_index, getattr(batch, "num_sampled_nodes", None),
                            getattr(batch, "num_sampled_edges", None))
                loss = F.cross_entropy(out[:batch.batch_size], batch.y[:batch.batch_size])
                opt.zero_grad()
                loss.backward()
                opt.step()
            total_loss += float(loss)
            batches += 1
        seconds = time.perf_counter() - t0
        val, test = evaluate_full(model, adj_t, x, data)
        run.record_epoch(epoch, seconds, sample_t.seconds, train_t.seconds,
                         total_loss / max(batches, 1), val, test)


def train_gcn(args, data: common.Graph, run: common.Run) -> None:
    x = torch.from_numpy(data.features)
    y = torch.from_numpy(data.labels)
    train_idx = torch.from_numpy(data.train_idx)
    adj_t = csr_adjacency(data, drop_self_loops=True)
    dims = [x.shape[1]] + [args.hidden] * (args.layers - 1) + [data.num_classes]
    # cached=True: the normalised adjacency is computed on the first call and reused, as a
    # full-batch trainer would (DGL's GraphConv recomputes degrees, which are cheap).
    model = Stack(lambda i, o: GCNConv(i, o, cached=True), dims, args.dropout)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    # Fill the normalisation cache before timing: it is set-up work, like building DGL's graph.
    with torch.no_grad():
        model.eval()
        model(x, adj_t)
    for epoch in range(args.epochs):
        model.train()
        t0 = time.perf_counter()
        logits = model(x, adj_t)
        loss = F.cross_entropy(logits[train_idx], y[train_idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        seconds = time.perf_counter() - t0
        val, test = evaluate_full(model, adj_t, x, data)
        run.record_epoch(epoch, seconds, 0.0, seconds, float(loss), val, test)


def main() -> None:
    args = ARGS
    torch.set_num_threads(args.threads)
    torch_geometric.seed_everything(args.seed)
    t = time.perf_counter()
    data = common.load_dataset(args.data)
    common.log(f"PyG {torch_geometric.__version__} (torch {torch.__version__}), "
               f"{args.threads} threads: {data.name}: {data.num_nodes} nodes, "
               f"{data.num_edges} edges, {data.features.shape[1]} features, "
               f"{data.num_classes} classes, "
               f"{len(data.train_idx)}/{len(data.val_idx)}/{len(data.test_idx)} split; "
               f"loaded in {time.perf_counter() - t:.2f} s")
    run = common.Run("pyg", torch_geometric.__version__, args, data)
    (train_sage if args.model == "sage" else train_gcn)(args, data, run)
    sampler = ("pyg_lib" if pyg_typing.WITH_PYG_LIB
               else "torch_sparse" if pyg_typing.WITH_TORCH_SPARSE else None)
    run.finish({"torch_version": torch.__version__,
                "sampler": sampler if args.model == "sage" else None,
                "trim_to_layer": args.model == "sage" and pyg_typing.WITH_PYG_LIB})


if __name__ == "__main__":
    main()
