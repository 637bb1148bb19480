"""Checks of the peer benchmarks' shared code and of the two systems agreeing on one graph.

    benchmarks/peers/.venv/bin/python -m unittest benchmarks/peers/test_peers.py

The DGL / PyG tests are skipped (with a message) when those packages are not installed.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import common  # noqa: E402


def pairwise_auc(scores, labels) -> float:
    """AUC by its definition: P(score of a positive > score of a negative), ties count 1/2."""
    pos = [s for s, y in zip(scores, labels) if y == 1]
    neg = [s for s, y in zip(scores, labels) if y == 0]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


def write_h5(path: Path, n=6, self_loop=True, **overrides) -> None:
    """A small undirected graph in gnnpar's HDF5 v1 layout: a ring plus a chord (and a
    self-loop on vertex 0), 3 features, 3 classes."""
    import h5py

    edges = [(v, (v + 1) % n) for v in range(n)] + [(0, 3)]
    pairs = sorted({(b, a) for a, b in edges} | {(a, b) for a, b in edges}
                   | ({(0, 0)} if self_loop else set()), key=lambda e: (e[1], e[0]))
    indices = np.array([u for u, _ in pairs], dtype=np.uint32)
    indptr = np.zeros(n + 1, dtype=np.uint64)
    indptr[1:] = np.cumsum(np.bincount([v for _, v in pairs], minlength=n))
    rng = np.random.default_rng(1)
    fields = dict(
        indptr=indptr, indices=indices,
        features=rng.standard_normal((n, 3)).astype(np.float32),
        labels=np.arange(n, dtype=np.int64) % 3,
        train_idx=np.array([0, 1, 2], dtype=np.uint64),
        val_idx=np.array([3, 4], dtype=np.uint64), test_idx=np.array([5], dtype=np.uint64))
    attrs = dict(format_version=np.uint32(1), num_nodes=np.uint64(n), first_node=np.uint64(0),
                 num_edges=np.uint64(len(indices)), num_classes=np.uint64(3),
                 directed=np.uint8(0), name="tiny")
    for key, value in overrides.items():
        (attrs if key in attrs else fields)[key] = value
    with h5py.File(path, "w") as f:
        for key, value in attrs.items():
            if value is not None:
                f.attrs[key] = value
        for key, value in fields.items():
            if value is not None:
                f[key] = value


class MetricTests(unittest.TestCase):
    def test_auc_matches_the_pairwise_definition_with_ties(self):
        rng = np.random.default_rng(0)
        for _ in range(20):
            scores = rng.integers(0, 5, size=30).astype(float)  # many ties
            labels = rng.integers(0, 2, size=30)
            if labels.min() == labels.max():
                continue
            self.assertAlmostEqual(common.roc_auc(scores, labels),
                                   pairwise_auc(scores, labels), places=12)

    def test_auc_extremes_and_undefined(self):
        self.assertEqual(common.roc_auc(np.array([0.1, 0.2, 0.9]), np.array([0, 0, 1])), 1.0)
        self.assertEqual(common.roc_auc(np.array([0.9, 0.2, 0.1]), np.array([0, 0, 1])), 0.0)
        self.assertTrue(np.isnan(common.roc_auc(np.array([0.1, 0.2]), np.array([1, 1]))))

    def test_binary_task_uses_auc_of_the_positive_logit(self):
        logits = np.array([[0.0, 1.0], [1.0, 0.0], [0.0, 2.0]])
        self.assertEqual(common.metric_name(2), "roc_auc")
        self.assertEqual(common.evaluate(logits, np.array([1, 0, 1]), 2), 1.0)
        self.assertEqual(common.metric_name(7), "accuracy")
        self.assertAlmostEqual(common.evaluate(logits, np.array([1, 1, 1]), 7), 2 / 3)


class LoaderTests(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = Path(self.dir.name) / "dataset.h5"

    def tearDown(self):
        self.dir.cleanup()

    def load_error(self, **overrides) -> str:
        write_h5(self.path, **overrides)
        err = io.StringIO()
        with contextlib.redirect_stderr(err), self.assertRaises(SystemExit):
            common.load_dataset(self.path)
        return err.getvalue()

    def test_reads_the_csr_as_edges_into_each_row(self):
        write_h5(self.path)
        g = common.load_dataset(self.path)
        self.assertEqual((g.name, g.num_nodes, g.num_classes), ("tiny", 6, 3))
        src, dst = g.edges()
        edges = set(zip(src.tolist(), dst.tolist()))
        self.assertIn((3, 0), edges)   # the chord, both ways
        self.assertIn((0, 3), edges)
        self.assertIn((0, 0), edges)
        self.assertEqual(len(edges), g.num_edges)
        self.assertTrue(np.all(g.indptr[1:] >= g.indptr[:-1]))

    def test_bad_files_name_the_field(self):
        self.assertIn("format_version 2", self.load_error(format_version=np.uint32(2)))
        self.assertIn("`first_node` is 3", self.load_error(first_node=np.uint64(3)))
        self.assertIn("`indptr` has 7 entries", self.load_error(num_nodes=np.uint64(5)))
        self.assertIn("`features` is missing", self.load_error(features=None))
        self.assertIn("multi-label", self.load_error(labels=np.zeros((6, 2), np.int64)))
        self.assertIn("`labels[4]` = 7", self.load_error(
            labels=np.array([0, 1, 2, 0, 7, 1], np.int64)))
        self.assertIn("`train_idx` holds ids outside", self.load_error(
            train_idx=np.array([0, 9], np.uint64)))
        self.assertIn("`indices` holds ids outside", self.load_error(
            indices=np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 99], np.uint32)))


def have(module: str) -> bool:
    try:
        __import__(module)
        return True
    except ImportError:
        return False


@unittest.skipUnless(have("dgl") and have("torch_geometric"),
                     "SKIPPED: DGL or PyG not installed (run setup.sh)")
class SystemsAgreeTests(unittest.TestCase):
    """Both systems compute the same layers from the same file (the benchmark's premise)."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = Path(self.dir.name) / "dataset.h5"
        write_h5(self.path)
        self.g = common.load_dataset(self.path)

    def tearDown(self):
        self.dir.cleanup()

    def test_gcn_and_sage_layers_agree(self):
        import torch
        import dgl
        from dgl.nn import GraphConv, SAGEConv as DglSage
        from torch_geometric.nn import GCNConv, SAGEConv as PygSage
        sys.argv = ["x", "--data", str(self.path)]
        import pyg_bench  # noqa: F401  (parses the argv above; defines csr_adjacency)

        x = torch.from_numpy(self.g.features)
        src, dst = self.g.edges()
        graph = dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=6)

        # GCN: DGL on A + I (self-loops removed then added) vs PyG on the CSR without loops.
        d = GraphConv(3, 4, norm="both")
        p = GCNConv(3, 4)
        with torch.no_grad():
            p.lin.weight.copy_(d.weight.T)
            p.bias.copy_(d.bias)
            ours = d(dgl.add_self_loop(dgl.remove_self_loop(graph)), x)
            theirs = p(x, pyg_bench.csr_adjacency(self.g, drop_self_loops=True))
        a = np.zeros((6, 6))
        a[dst, src] = 1
        np.fill_diagonal(a, 1)
        dinv = 1 / np.sqrt(a.sum(1))
        expect = (dinv[:, None] * a * dinv[None, :]) @ (self.g.features @ d.weight.detach()
                                                       .numpy()) + d.bias.detach().numpy()
        np.testing.assert_allclose(ours.numpy(), expect, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(theirs.numpy(), expect, rtol=1e-5, atol=1e-5)

        # SAGE mean: same weights, whole graph (the evaluation path of both scripts).
        d = DglSage(3, 4, "mean")
        p = PygSage(3, 4, aggr="mean")
        with torch.no_grad():
            p.lin_l.weight.copy_(d.fc_neigh.weight)
            p.lin_l.bias.copy_(d.fc_self.bias)  # DGL keeps the bias in fc_self
            p.lin_r.weight.copy_(d.fc_self.weight)
            ours = d(graph, x)
            theirs = p(x, pyg_bench.csr_adjacency(self.g))
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-5)

    def test_scripts_print_one_json_line(self):
        runs = [(script, model) for script in ("dgl_bench.py", "pyg_bench.py")
                for model in ("gcn", "sage")]
        for script, model in runs:
            if script == "pyg_bench.py" and model == "sage" and not (
                    have("torch_sparse") or have("pyg_lib")):
                print("SKIPPED: PyG SAGE needs torch_sparse or pyg_lib", file=sys.stderr)
                continue
            with self.subTest(script=script, model=model):
                proc = subprocess.run(
                    [sys.executable, str(HERE / script), "--data", str(self.path), "--model",
                     model, "--epochs", "3", "--threads", "1", "--batch-size", "2"],
                    capture_output=True, text=True)
                self.assertEqual(proc.returncode, 0, proc.stderr)
                out = proc.stdout.strip().splitlines()
                self.assertEqual(len(out), 1, out)
                result = json.loads(out[0])
                self.assertEqual(result["system"], script.split("_")[0])
                self.assertEqual(result["model"], model)
                self.assertEqual(len(result["epoch_seconds"]), 3)
                self.assertEqual(result["metric_name"], "accuracy")
                self.assertEqual(result["dataset"], "tiny")
                self.assertIn(result["best_epoch"], [0, 1, 2])
                self.assertGreater(result["peak_rss_mb"], 0)
                if model == "sage":
                    # 3 training seeds in batches of 2: two mini-batches sampled per epoch.
                    self.assertGreater(result["sample_seconds"], 0)

    def test_bad_option_is_refused(self):
        proc = subprocess.run(
            [sys.executable, str(HERE / "dgl_bench.py"), "--data", str(self.path),
             "--fanouts", "15,10"], capture_output=True, text=True)
        self.assertEqual(proc.returncode, 2)
        self.assertIn("--fanouts has 2 entries but --layers is 3", proc.stderr)


if __name__ == "__main__":
    unittest.main()
