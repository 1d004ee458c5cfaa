"""Shared checks of the device equivalence scripts (tests/device/gpu_*_check.sh): read the JSONL metrics
`mcpp train --metrics-path OUT/NAME.jsonl` wrote and compare runs' per-iteration lm loss."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "gpu"))
from run_metrics import records  # noqa: E402  (the one JSONL reader of the device scripts)


class Checks:
    def __init__(self, out):
        self.out = out
        self.ok = True  # every check so far passed

    def records(self, name, event):
        """NAME's metric records of one event kind ([] when the file is missing)."""
        return records(self.out, name, event)

    def losses(self, name):
        return [r["lm_loss"] for r in self.records(name, "train")]

    def same_losses(self, ref, runs, tol, iterations=6, ref_losses=None, width=19):
        """Each run's losses against ref's (or ref_losses): `iterations` of them, max relative difference < tol."""
        a = self.losses(ref) if ref_losses is None else ref_losses
        for n in runs:
            b = self.losses(n)
            err = max((abs(x - y) / abs(x) for x, y in zip(a, b)), default=float("inf"))
            good = len(a) == len(b) == iterations and err < tol
            self.ok &= good
            print(f"{n:{width}s} vs {ref}: max rel loss diff {err:.2e} (tol {tol:g}) {'OK' if good else 'MISMATCH'}"
                  f"  {b[:3]}")

    def captured_at(self, runs, iteration=3, width=19):
        """Each run logged exactly one cuda_graph event, at `iteration` (the replays really ran)."""
        for n in runs:
            ev = self.records(n, "cuda_graph")
            good = len(ev) == 1 and ev[0]["iteration"] == iteration
            self.ok &= good
            print(f"{n:{width}s} cuda graph: {ev[0] if ev else 'NOT CAPTURED'}")
