#!/usr/bin/env python3
"""PyTorch Geometric peer for the GPU benchmark: full-batch GCN or GraphSAGE on one GPU.

    python3 pyg_gpu_full.py --npz dataset.npz --model gcn|sage [--epochs 20] [--device cuda]
                            [--adj edge_index|csr]

Reads the arrays of `gnnpar export --format npz` (numpy only: the GPU image need not have
h5py). Prints one JSON line on stdout; logs go to stderr. An out-of-memory GPU is a result,
not a crash: the line says `"status": "out of memory"` with the bytes PyTorch had asked for.

* gcn: 2 x GCNConv (symmetric normalisation with self-loops, normalisation cached), hidden
  256, ReLU and dropout 0.5 between layers, Adam lr 0.01 (benchmarks/peers/README.md).
* sage: 3 x SAGEConv(aggr='mean'), hidden 256, ReLU and dropout 0.5 between layers, Adam
  lr 0.003.
* epoch = forward over the whole graph, cross-entropy on the training vertices, backward and
  one Adam step, timed between `torch.cuda.synchronize()` calls. Peak device memory is
  `torch.cuda.max_memory_allocated()` over the whole run (data, model, activations), the same
  quantity gnnpar's `peak_device_mb` counts (bytes held in device allocations); the caching
  allocator's reserved peak is reported beside it.
* `--adj edge_index` (default) is PyG's standard form: messages are materialised per edge,
  which is what runs out of memory on large graphs. `--adj csr` passes a torch CSR adjacency
  (`adj_t`), which PyG aggregates with a sparse-dense product where the backend supports it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def log(msg: str) -> None:
    print(f"[pyg-gpu] {msg}", file=sys.stderr, flush=True)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--npz", required=True, help="`gnnpar export --format npz` output")
    p.add_argument("--model", choices=["gcn", "sage"], required=True)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, help="default: gcn 2, sage 3")
    p.add_argument("--lr", type=float, help="default: gcn 0.01, sage 0.003")
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--device", default="cuda")
    p.add_argument("--adj", choices=["edge_index", "csr"], default="edge_index")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    a.layers = a.layers or (2 if a.model == "gcn" else 3)
    a.lr = a.lr or (0.01 if a.model == "gcn" else 0.003)
    return a


def main() -> None:
    a = parse_args()
    import torch
    import torch.nn.functional as F
    import torch_geometric
    from torch_geometric.nn import GCNConv, SAGEConv

    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    on_gpu = dev.type == "cuda"
    result = {
        "system": "pyg",
        "version": torch_geometric.__version__,
        "torch": torch.__version__,
        "model": a.model,
        "mode": "full-batch",
        "adj": a.adj,
        "device": torch.cuda.get_device_name(dev) if on_gpu else "cpu",
        "epochs": a.epochs,
        "config": {"hidden": a.hidden, "layers": a.layers, "lr": a.lr, "dropout": a.dropout},
    }
    z = np.load(a.npz)
    indptr, indices = z["indptr"], z["indices"]
    n = indptr.shape[0] - 1
    result.update(num_nodes=int(n), num_edges=int(indices.shape[0]))
    if on_gpu:
        torch.cuda.reset_peak_memory_stats(dev)
    try:
        x = torch.from_numpy(np.ascontiguousarray(z["features"], dtype=np.float32)).to(dev)
        y = torch.from_numpy(z["labels"].astype(np.int64)).to(dev)
        train = torch.from_numpy(z["train_idx"].astype(np.int64)).to(dev)
        test = torch.from_numpy(z["test_idx"].astype(np.int64)).to(dev)
        classes = int(z["num_classes"])
        if a.adj == "edge_index":
            # gnnpar's CSR: row v lists the senders u of messages u -> v.
            dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
            adj = torch.from_numpy(np.stack([indices.astype(np.int64), dst])).to(dev)
        else:
            adj = torch.sparse_csr_tensor(
                torch.from_numpy(indptr.astype(np.int64)),
                torch.from_numpy(indices.astype(np.int64)),
                torch.ones(indices.shape[0], dtype=torch.float32),
                size=(n, n),
            ).to(dev)
        dims = [x.shape[1]] + [a.hidden] * (a.layers - 1) + [classes]
        if a.model == "gcn":
            convs = [GCNConv(i, o, cached=True) for i, o in zip(dims, dims[1:])]
        else:
            convs = [SAGEConv(i, o, aggr="mean") for i, o in zip(dims, dims[1:])]
        model = torch.nn.ModuleList(convs).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=a.lr)

        def forward(h):
            for i, conv in enumerate(model):
                h = conv(h, adj)
                if i < len(model) - 1:
                    h = F.dropout(F.relu(h), a.dropout, model.training)
            return h

        sync = torch.cuda.synchronize if on_gpu else (lambda: None)
        seconds, losses = [], []
        model.train()
        for epoch in range(a.epochs):
            sync()
            t = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            out = forward(x)
            loss = F.cross_entropy(out[train], y[train])
            loss.backward()
            opt.step()
            sync()
            seconds.append(time.perf_counter() - t)
            losses.append(float(loss.detach()))
            log(f"epoch {epoch}: {seconds[-1] * 1e3:.1f} ms, loss {losses[-1]:.4f}")
        model.eval()
        with torch.no_grad():
            pred = forward(x)[test].argmax(1)
            acc = float((pred == y[test]).float().mean()) if test.numel() else None
        result.update(
            status="ok",
            epoch_seconds=[round(s, 6) for s in seconds],
            # The first epoch builds caches and autotunes; the median is the steady state.
            epoch_time_median=float(np.median(seconds)),
            final_loss=losses[-1] if losses else None,
            test_accuracy_final=acc,
        )
    except torch.cuda.OutOfMemoryError as e:
        result.update(status="out of memory", error=str(e).splitlines()[0][:300])
    except RuntimeError as e:  # e.g. an adjacency layout this PyG cannot aggregate on the GPU
        result.update(status="failed", error=str(e).splitlines()[0][:300])
    if on_gpu:
        result.update(
            peak_device_mb=torch.cuda.max_memory_allocated(dev) / 2**20,
            peak_reserved_mb=torch.cuda.max_memory_reserved(dev) / 2**20,
        )
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
