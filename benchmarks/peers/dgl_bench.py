#!/usr/bin/env python3
"""DGL peer benchmark: GraphSAGE mini-batch or GCN full-batch on a gnnpar dataset.h5.

    .venv/bin/python dgl_bench.py --data dataset.h5 --model sage [--epochs 3] [--threads 2]
    .venv/bin/python dgl_bench.py --data dataset.h5 --model gcn  [--epochs 200]

Prints one JSON line on stdout (see README.md); logs go to stderr.

* sage: 3 x SAGEConv('mean'), hidden 256, ReLU and dropout 0.5 between layers; NeighborSampler
  with the fanouts reversed (DGL lists them input layer first: 15,10,5 from the seeds -> [5,10,15]);
  batch 1024 seeds, all training vertices once per epoch, shuffled; Adam lr 0.003.
* gcn: 2 x GraphConv(norm='both') on the graph with one self-loop per vertex, hidden 256,
  ReLU and dropout 0.5 between layers, Adam lr 0.01, whole graph every epoch.

Evaluation (every epoch, not counted in the epoch time) runs the model on the whole graph with
all neighbours (no sampling, dropout off) and reports the metric at the best-validation epoch.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

ARGS = common.parse_args("DGL")
common.setup_threads(ARGS.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import dgl  # noqa: E402
from dgl.nn import GraphConv, SAGEConv  # noqa: E402


class Stack(nn.Module):
    """`layers` graph convolutions with ReLU and dropout between them (none after the last)."""

    def __init__(self, make_conv, dims: list[int], dropout: float):
        super().__init__()
        self.convs = nn.ModuleList(make_conv(dims[i], dims[i + 1]) for i in range(len(dims) - 1))
        self.dropout = nn.Dropout(dropout)

    def forward(self, graphs, h):
        """`graphs`: one DGL block per layer (mini-batch) or the whole graph repeated."""
        last = len(self.convs) - 1
        for i, (conv, g) in enumerate(zip(self.convs, graphs)):
            h = conv(g, h)
            if i < last:
                h = self.dropout(F.relu(h))
        return h


def build_graph(data: common.Graph) -> dgl.DGLGraph:
    src, dst = data.edges()
    g = dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=data.num_nodes,
                  idtype=torch.int64)
    return g


def evaluate_full(model, g, x, y_np, data: common.Graph) -> tuple[float, float]:
    model.eval()
    with torch.no_grad():
        logits = model([g] * len(model.convs), x).numpy()
    model.train()
    return (common.evaluate(logits[data.val_idx], y_np[data.val_idx], data.num_classes),
            common.evaluate(logits[data.test_idx], y_np[data.test_idx], data.num_classes))


def train_sage(args, data: common.Graph, run: common.Run) -> None:
    g = build_graph(data)
    # Build every sparse format now so that the first epoch does not pay for the conversions.
    g.create_formats_()
    x = torch.from_numpy(data.features)
    y = torch.from_numpy(data.labels)
    dims = [x.shape[1]] + [args.hidden] * (args.layers - 1) + [data.num_classes]
    model = Stack(lambda i, o: SAGEConv(i, o, "mean"), dims, args.dropout)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    sampler = dgl.dataloading.NeighborSampler(list(reversed(args.fanouts)))
    loader = dgl.dataloading.DataLoader(
        g, torch.from_numpy(data.train_idx), sampler, batch_size=args.batch_size, shuffle=True,
        drop_last=False, num_workers=0)
    for epoch in range(args.epochs):
        model.train()
        sample_t, train_t = common.Stopwatch(), common.Stopwatch()
        total_loss, batches = 0.0, 0
        t0 = time.perf_counter()
        batches_iter = iter(loader)
        while True:
            # Sampling time covers producing the blocks and gathering their input features and
            # seed labels from host memory (PyG's NeighborLoader does both inside the loader).
            with sample_t:
                try:
                    input_nodes, output_nodes, blocks = next(batches_iter)
                except StopIteration:
                    break
                h = x[input_nodes]
                target = y[output_nodes]
            with train_t:
                loss = F.cross_entropy(model(blocks, h), target)
                opt.zero_grad()
                loss.backward()
                opt.step()
            total_loss += float(loss)
            batches += 1
        seconds = time.perf_counter() - t0
        val, test = evaluate_full(model, g, x, data.labels, data)
        run.record_epoch(epoch, seconds, sample_t.seconds, train_t.seconds,
                         total_loss / max(batches, 1), val, test)


def train_gcn(args, data: common.Graph, run: common.Run) -> None:
    # One self-loop per vertex whether or not the file already has some (A + I), as PyG's
    # GCNConv does with add_remaining_self_loops.
    g = dgl.add_self_loop(dgl.remove_self_loop(build_graph(data)))
    g.create_formats_()
    x = torch.from_numpy(data.features)
    y = torch.from_numpy(data.labels)
    train_idx = torch.from_numpy(data.train_idx)
    dims = [x.shape[1]] + [args.hidden] * (args.layers - 1) + [data.num_classes]
    model = Stack(lambda i, o: GraphConv(i, o, norm="both"), dims, args.dropout)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    graphs = [g] * args.layers
    for epoch in range(args.epochs):
        model.train()
        t0 = time.perf_counter()
        logits = model(graphs, x)
        loss = F.cross_entropy(logits[train_idx], y[train_idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        seconds = time.perf_counter() - t0
        val, test = evaluate_full(model, g, x, data.labels, data)
        run.record_epoch(epoch, seconds, 0.0, seconds, float(loss), val, test)


def main() -> None:
    args = ARGS
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    dgl.seed(args.seed)
    t = time.perf_counter()
    data = common.load_dataset(args.data)
    common.log(f"DGL {dgl.__version__} (torch {torch.__version__}), {args.threads} threads: "
               f"{data.name}: {data.num_nodes} nodes, {data.num_edges} edges, "
               f"{data.features.shape[1]} features, {data.num_classes} classes, "
               f"{len(data.train_idx)}/{len(data.val_idx)}/{len(data.test_idx)} split; "
               f"loaded in {time.perf_counter() - t:.2f} s")
    run = common.Run("dgl", dgl.__version__, args, data)
    (train_sage if args.model == "sage" else train_gcn)(args, data, run)
    run.finish({"torch_version": torch.__version__})


if __name__ == "__main__":
    main()
