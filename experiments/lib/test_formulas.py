"""Unit tests of experiments/lib (formulas on fixed inputs, the environment-clean check, the stdlib checkpoint /
npy readers). Run: python3 -m unittest discover -s experiments/lib -p 'test_*.py' (ctest experiments.lib)."""
import array
import contextlib
import io
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ckpt  # noqa: E402
import formulas as F  # noqa: E402
import runner  # noqa: E402


class Formulas(unittest.TestCase):
    def test_bubble(self):
        # Narayanan et al. 2021: p = 4, m = 8 -> 3/11; interleaved V = 2 halves the m term's share: 3/19
        self.assertAlmostEqual(F.bubble_theoretical(4, 8), 3 / 11)
        self.assertAlmostEqual(F.bubble_theoretical(4, 8, 2), 3 / 19)
        self.assertEqual(F.bubble_theoretical(1, 5), 0.0)
        self.assertAlmostEqual(F.bubble_measured(75.0, 100.0), 0.25)
        with self.assertRaises(ValueError):
            F.bubble_theoretical(0, 4)

    def test_bytes_per_param(self):
        # Megatron-Core's distributed optimizer table: bf16 params / fp32 grads: 18 vs 6 + 12/d
        self.assertEqual(F.bytes_per_param("bf16", "fp32", 8, False), 18)
        self.assertAlmostEqual(F.bytes_per_param("bf16", "fp32", 8, True), 7.5)
        self.assertAlmostEqual(F.bytes_per_param("fp32", "fp32", 2, True), 12.0)
        self.assertEqual(F.bytes_per_param("fp32", "fp32", 1, True), 16.0)  # d = 1: nothing to shard
        with self.assertRaises(ValueError):
            F.bytes_per_param("fp8", "fp32", 2, True)

    def test_ring_bytes(self):
        self.assertAlmostEqual(F.ring_bytes_per_rank("all_reduce", 4, 1000), 1500.0)
        self.assertAlmostEqual(F.ring_bytes_per_rank("reduce_scatter", 4, 1000), 750.0)
        self.assertAlmostEqual(F.ring_bytes_per_rank("all_gather", 1, 1000), 0.0)
        # RS + AG moves exactly what one all-reduce moves (the distributed optimizer's claim)
        self.assertAlmostEqual(F.ring_bytes_per_rank("reduce_scatter", 8, 64) + F.ring_bytes_per_rank(
            "all_gather", 8, 64), F.ring_bytes_per_rank("all_reduce", 8, 64))

    def test_flops_mfu(self):
        # GPT-2 124M (L 12, h 768, s 1024, V 50304), B 8: Megatron's formula by hand
        b, s, L, h, V = 8, 1024, 12, 768, 50304
        want = 72 * b * s * L * h * h * (1 + s / (12 * h) + V / (12 * L * h))
        self.assertAlmostEqual(F.gpt_flops_per_step(b, s, L, h, V), want)
        self.assertAlmostEqual(F.mfu(989e12 * 0.5, 1.0, 989e12), 0.5)
        self.assertAlmostEqual(F.mfu(4e12, 0.5, 1e12, ranks=2), 4.0)

    def test_intervals(self):
        comm = [(0, 10), (20, 30)]
        compute = [(5, 25), (24, 26)]
        self.assertEqual(F.union(compute), [(5, 26)])
        self.assertEqual(F.length(comm), 20)
        self.assertEqual(F.intersection_length(comm, compute), 11)  # (5, 10) and (20, 26)
        self.assertEqual(F.exposed_comm(comm, compute), 9)
        self.assertEqual(F.exposed_comm(comm, []), 20)

    def test_stage_times(self):
        x = lambda pid, cat, name, ts, dur, step: {"ph": "X", "pid": pid, "cat": cat, "name": name, "ts": ts,
                                                   "dur": dur, "args": {"step": step}}
        tr = {"traceEvents": [{"ph": "M", "pid": 0},
                              x(0, "forward", "F0.0", 0, 5000, 0),      # warm-up step: left out
                              x(0, "forward", "F0.0", 10000, 1000, 1), x(0, "backward", "B0.0", 10500, 2000, 1),
                              x(0, "forward", "F0.0", 20000, 3000, 2),
                              x(0, "layer", "decoder.layers.1", 10000, 400, 1),
                              x(0, "layer", "embedding", 10000, 100, 1),
                              x(1, "backward", "B0.0", 10000, 4000, 1), x(1, "forward", "F0.0", 20000, 2000, 2),
                              x(1, "layer", "decoder.layers.3", 10000, 400, 1),
                              x(1, "layer", "decoder.layers.2", 10000, 400, 2)]}
        st = F.stage_times(tr)
        self.assertAlmostEqual(st[0]["busy_ms"], (2.5 + 3.0) / 2)  # union [10000, 12500] + [20000, 23000]
        self.assertAlmostEqual(st[1]["busy_ms"], (4.0 + 2.0) / 2)
        self.assertEqual(st[0]["layers"], [1])
        self.assertEqual(st[1]["layers"], [2, 3])

    def test_stats(self):
        self.assertEqual(F.median([3, 1, 2]), 2)
        self.assertEqual(F.median([4, 1, 2, 3]), 2.5)
        self.assertEqual(F.mad([1, 2, 3, 4, 100]), 1)
        sp = F.spread([10.0, 12.0, 11.0])
        self.assertEqual((sp["median"], sp["min"], sp["max"]), (11.0, 10.0, 12.0))
        self.assertAlmostEqual(sp["rel_spread"], 2 / 11)
        s = F.summarize_repeats([{"a": 1, "b": "x", "c": True}, {"a": 3, "b": "y", "c": False}])
        self.assertEqual(list(s), ["a"])  # strings and booleans are not metrics

    def test_recompute_flops(self):
        # full recompute adds one forward of every layer: model + full = Megatron's hardware count for full recompute,
        # 96 B s L h^2 (1 + s/(12h) + V/(16 L h)) (docs/OBSERVABILITY.md)
        b, s, L, h, V = 2, 4096, 12, 768, 50304
        hw_full = 96 * b * s * L * h * h * (1 + s / (12 * h) + V / (16 * L * h))
        self.assertAlmostEqual(F.gpt_flops_per_step(b, s, L, h, V) + F.recompute_flops("full", b, s, L, h), hw_full,
                               delta=hw_full * 1e-12)
        self.assertEqual(F.recompute_flops("selective", 2, 1024, 12, 768), 2 * 2 * 1024 * 1024 * 768 * 12)
        self.assertEqual(F.recompute_flops("none", 2, 1024, 12, 768), 0.0)
        with self.assertRaises(ValueError):
            F.recompute_flops("block", 2, 1024, 12, 768)

    def test_moe_capacity_drops_aux_bounds(self):
        # Megatron's get_capacity(num_tokens * topk, E, factor): 128 tokens, top-2 of 8, factor 1.0 -> 32; 1.25 -> 40
        self.assertEqual(F.expert_capacity(128, 2, 8, 1.0), 32)
        self.assertEqual(F.expert_capacity(128, 2, 8, 1.25), 40)
        self.assertEqual(F.expert_capacity(100, 2, 8, 1.0), 25)
        self.assertEqual(F.expert_capacity(101, 2, 8, 1.0), 26)  # ceil(25.25)
        # layer 0 of a CPU run (128 tokens, top-2 of 8, factor 1.0): the trainer logged 0.09765625 = 25 / 256
        t = [39, 24, 30, 31, 33, 48, 18, 33]
        self.assertEqual(F.dropped_fraction(t, 32), 25 / 256)
        self.assertEqual(F.dropped_fraction(t, 48), 0.0)
        self.assertEqual(F.dropped_fraction([0, 0], 1), 0.0)
        # even load: the switch loss is exactly 1; that run's logged 1.0028 lies inside its bounds
        self.assertEqual(F.switch_aux_loss_bounds([32] * 8, 128, 2), (1.0, 1.0))
        lo, hi = F.switch_aux_loss_bounds(t, 128, 2)
        self.assertEqual((lo, hi), (8 * 18 / 256, 8 * 48 / 256))
        self.assertTrue(lo <= 1.0028451681137085 <= hi)

    def test_load_io(self):
        st = F.load_stats([10, 10, 10, 10])
        self.assertEqual((st["cv"], st["max_over_mean"]), (0.0, 1.0))
        st = F.load_stats([0, 0, 0, 40])
        self.assertAlmostEqual(st["cv"], 3 ** 0.5)
        self.assertAlmostEqual(F.throughput_mb_s(5e6, 500), 10.0)


class CleanCheck(unittest.TestCase):
    def test_stray_process_and_staging_dir(self):
        work = tempfile.mkdtemp()
        tag = "test" + str(os.getpid())
        self.assertEqual(runner.clean_check(tag, work, "cpu", None), [])
        p = subprocess.Popen(["sleep", "30"], env={**os.environ, runner.TAG_VAR: tag})
        try:
            # until the child has exec'd, /proc/<pid>/environ is still ours (no tag): wait for the exec (<= 10 s)
            deadline = time.monotonic() + 10
            while not runner.tagged_processes(tag) and time.monotonic() < deadline:
                time.sleep(0.01)
            dirty = runner.clean_check(tag, work, "cpu", None)
            self.assertEqual(len(dirty), 1)
            self.assertIn(f"stray process {p.pid}", dirty[0])
        finally:
            p.kill()
            p.wait()
        os.makedirs(os.path.join(work, "ckpt", "iter_0000003.tmp-ab12"))
        self.assertIn("leftover staging directory", runner.clean_check(tag, work, "cpu", None)[0])


class Tiers(unittest.TestCase):
    """The gpu / gpu-multi tiers' machine checks, with a fake nvidia-smi reporting one idle GPU."""

    def setUp(self):
        self.bin = tempfile.mkdtemp()
        with open(os.path.join(self.bin, "nvidia-smi"), "w") as f:
            f.write('#!/bin/sh\ncase "$*" in\n  *query-gpu=index*) echo 0 ;;\n  *query-gpu=memory.used*) echo 500 ;;\n'
                    '  *query-compute-apps*) ;;\n  *) echo "NVIDIA H100 80GB HBM3, 550.00, 81559 MiB" ;;\nesac\n')
        os.chmod(os.path.join(self.bin, "nvidia-smi"), 0o755)
        self.env = dict(os.environ)
        os.environ["PATH"] = self.bin + os.pathsep + os.environ.get("PATH", "")
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        self.results = tempfile.mkdtemp()

    def tearDown(self):
        os.environ.clear()
        os.environ.update(self.env)

    def test_visible_gpus(self):
        self.assertEqual(runner.visible_gpus(), 1)
        self.assertEqual(runner.gpu_state(1), ([500], []))
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        self.assertEqual(runner.visible_gpus(), 0)
        os.environ["CUDA_VISIBLE_DEVICES"] = "0,-1,1"  # CUDA stops at the first invalid entry
        self.assertEqual(runner.visible_gpus(), 1)

    def test_gpu_multi_refuses_on_one_gpu(self):
        for exp, gpus in (("E04", 2), ("E09", 4), ("E10", 4), ("E12", 2)):
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                rc, out = runner.run_experiment(exp, "gpu-multi", 1, sys.executable, self.results)
            self.assertEqual((rc, out), (2, None))
            lines = err.getvalue().splitlines()
            self.assertEqual(len(lines), 1, lines)
            self.assertTrue(lines[0].startswith(f"error: experiment {exp} --tier gpu-multi refused: needs {gpus} GPUs, "
                                                "1 visible"), lines[0])
        self.assertEqual(os.listdir(self.results), [])  # refused before anything ran or was written

    def test_gpu_tier_without_nvidia_smi(self):
        os.environ["PATH"] = tempfile.mkdtemp()  # no nvidia-smi at all
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc, _ = runner.run_experiment("E10", "gpu", 1, sys.executable, self.results)
        self.assertEqual(rc, 2)
        self.assertIn("error: experiment E10 --tier gpu: no GPU here", err.getvalue())

    def test_smoke_needs_a_gpu_tier(self):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc, _ = runner.run_experiment("E04", "cpu", 1, sys.executable, self.results, smoke=True)
        self.assertEqual(rc, 2)
        self.assertIn("--smoke runs a gpu tier's code on CPU ranks", err.getvalue())


class Readers(unittest.TestCase):
    def test_logical_tensor_from_two_row_shards(self):
        d = tempfile.mkdtemp()
        vals = array.array("f", range(12))  # a [4, 3] tensor, rows 0-1 in one shard, rows 2-3 in another
        raw = vals.tobytes()
        with open(os.path.join(d, "model.safetensors"), "wb") as f:
            f.write(raw)
        ent = lambda off, lo: {"key": "w", "dtype": "F32", "global_shape": [4, 3], "global_offset": [off, 0],
                               "local_shape": [2, 3], "file": "model.safetensors", "byte_offset": lo,
                               "byte_length": 24, "xxh3": "0" * 16}
        with open(os.path.join(d, "manifest.json"), "w") as f:
            json.dump({"tensors": [ent(2, 0), ent(0, 24)]}, f)  # file order != row order
        t = ckpt.logical_tensors(d)
        self.assertEqual(t["w"][0], [4, 3])
        self.assertEqual(list(t["w"][1]), [6, 7, 8, 9, 10, 11, 0, 1, 2, 3, 4, 5])
        with open(os.path.join(d, "manifest.json"), "w") as f:
            json.dump({"tensors": [ent(0, 0)]}, f)
        with self.assertRaises(ValueError):  # half the rows missing
            ckpt.logical_tensors(d)

    def test_npy(self):
        p = os.path.join(tempfile.mkdtemp(), "a.npy")
        header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }"
        header += " " * (63 - (10 + len(header)) % 64) + "\n"
        with open(p, "wb") as f:
            f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() +
                    array.array("f", [1, 2, 3, 4]).tobytes())
        shape, a = ckpt.read_npy(p)
        self.assertEqual((shape, list(a)), ((2, 2), [1, 2, 3, 4]))


if __name__ == "__main__":
    unittest.main()
