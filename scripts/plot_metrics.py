"""`mcpp metrics plot RUN --output report.png|.svg` (apps/mcpp/metrics.cpp runs this with Debian's python3 +
matplotlib): one figure of a training run from its metrics (docs/OBSERVABILITY.md):
  loss (train, and validation points) | learning rate | grad norm | throughput (tokens/s, TFLOP/s/GPU, MFU) |
  per-rank mean step time per log interval (the rank files <stem>.rank_<r>.jsonl) with the min / max band |
  MoE expert load: tokens per expert over the log intervals (all layers), or per layer at the last interval
  (--moe-per-layer-logging) — only for MoE runs.
RUN: a metrics file (e.g. runs/demo/metrics.jsonl) or a directory holding metrics.jsonl. Prints the output path."""
import glob
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot_metrics.py RUN OUTPUT")
    run, output = sys.argv[1], sys.argv[2]
    metrics = os.path.join(run, "metrics.jsonl") if os.path.isdir(run) else run
    recs = load(metrics)
    train = [r for r in recs if r.get("event") == "train"]
    if not train:
        sys.exit(f"error: {metrics} holds no training records")
    valid = [r for r in recs if r.get("event") == "valid" and not r.get("end_of_training")]
    stem = os.path.splitext(metrics)[0]
    rank_files = sorted(glob.glob(stem + ".rank_*.jsonl"), key=lambda p: int(p.rsplit("_", 1)[1].split(".")[0]))
    moe = [r for r in train if "moe_load" in r]
    panels = ["loss", "lr", "grad", "throughput", "ranks"] + (["moe"] if moe else [])
    cols = 2
    rows = (len(panels) + 1) // 2
    fig, axes = plt.subplots(rows, cols, figsize=(13, 3.6 * rows), squeeze=False)
    axes = [a for row in axes for a in row]
    it = [r["iteration"] for r in train]
    title = os.path.basename(os.path.dirname(os.path.abspath(metrics))) or metrics
    prov = next((r["provenance"] for r in recs if r.get("event") == "provenance"), None)
    if prov:
        title += f"  (mcpp {prov['version']}, {prov['git_commit'][:10]}, {prov['device']})"
    fig.suptitle(title)

    ax = axes[0]
    ax.plot(it, [r["lm_loss"] for r in train], label="train lm loss")
    if valid:
        ax.plot([r["iteration"] for r in valid], [r["lm_loss"] for r in valid], "o", label="validation")
    ax.set_xlabel("iteration")
    ax.set_ylabel("lm loss")
    ax.legend()
    ax.grid(alpha=0.3)

    ax = axes[1]
    ax.plot(it, [r["learning_rate"] for r in train])
    ax.set_xlabel("iteration")
    ax.set_ylabel("learning rate")
    ax.grid(alpha=0.3)

    ax = axes[2]
    ax.plot(it, [r["grad_norm"] for r in train])
    ax.set_xlabel("iteration")
    ax.set_ylabel("grad norm")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)

    ax = axes[3]
    ax.plot(it, [r["tokens_per_sec"] for r in train], color="C0")
    ax.set_xlabel("iteration")
    ax.set_ylabel("tokens/s", color="C0")
    ax.grid(alpha=0.3)
    if any("tflops_per_gpu" in r for r in train):
        ax2 = ax.twinx()
        ax2.plot(it, [r.get("tflops_per_gpu", 0) for r in train], color="C1")
        label = "TFLOP/s/GPU"
        if any("mfu" in r for r in train):
            label += f" (last MFU {100 * train[-1].get('mfu', 0):.1f}%)"
        ax2.set_ylabel(label, color="C1")

    ax = axes[4]
    if rank_files:
        for p in rank_files:
            rr = [r for r in load(p) if r.get("event") == "train"]
            ax.plot([r["iteration"] for r in rr], [r["step_ms_mean"] for r in rr], lw=1,
                    label=f"rank {rr[0]['rank']}" if rr else p)
        if len(rank_files) <= 8:
            ax.legend(fontsize=7)
    lo = [r.get("step_ms_min_over_ranks") for r in train]
    hi = [r.get("step_ms_max_over_ranks") for r in train]
    if all(v is not None for v in lo + hi):
        ax.fill_between(it, lo, hi, alpha=0.2, color="gray", label="min..max over ranks")
    ax.set_xlabel("iteration")
    ax.set_ylabel("step time (ms), per rank")
    ax.set_title("per-rank step time" + ("" if rank_files else " (no rank files)"), fontsize=9)
    ax.grid(alpha=0.3)

    if moe:
        ax = axes[5]
        layers = moe[-1].get("moe_load_layers")
        if layers:
            grid = [l["tokens_per_expert"] for l in layers]
            ylabels = [str(l["layer"]) for l in layers]
            ax.set_ylabel("MoE layer")
            ax.set_title(f"tokens per expert per layer, iteration {moe[-1]['iteration']}", fontsize=9)
        else:
            grid = [r["moe_load"]["tokens_per_expert"] for r in moe]
            ylabels = [str(r["iteration"]) for r in moe]
            ax.set_ylabel("iteration")
            ax.set_title("tokens per expert (all MoE layers) per log interval", fontsize=9)
        im = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis")
        step = max(1, len(ylabels) // 12)
        ax.set_yticks(range(0, len(ylabels), step))
        ax.set_yticklabels(ylabels[::step])
        experts = len(grid[0]) if grid else 0
        ax.set_xticks(range(0, experts, max(1, experts // 16)))
        ax.set_xlabel("expert")
        fig.colorbar(im, ax=ax, label="tokens per iteration")
    for a in axes[len(panels):]:
        a.axis("off")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    fig.savefig(output, dpi=110)
    print(output)


if __name__ == "__main__":
    main()
