#!/usr/bin/env python3
"""Overlays the loss curves of several training runs (metrics JSONL of `mcpp train --metrics-path`): the training loss
per logged iteration (left), the validation loss points (middle), and each run's training loss relative to the
first run's (right: (run - first) / first, smoothed over 5 logs). For the FP8 accuracy runs (bench/gpu/fp8_accuracy.sh)
and the SFT curve (bench/gpu/sft_curve.sh). Debian's python3 + matplotlib.
usage: plot_curves.py OUT.png LABEL=metrics.jsonl [LABEL=metrics.jsonl ...] [--title TEXT]"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def curves(path):
    train, valid = {}, {}
    for line in open(path):
        r = json.loads(line) if line.strip() else {}
        if r.get("event") == "train" and "lm_loss" in r:
            train[r["iteration"]] = r["lm_loss"]
        elif r.get("event") == "valid":
            valid[r["iteration"]] = r["lm_loss"]
    return train, valid


def main():
    args = sys.argv[1:]
    title = ""
    if "--title" in args:
        i = args.index("--title")
        title = args[i + 1]
        del args[i:i + 2]
    if len(args) < 2 or any("=" not in a for a in args[1:]):
        sys.exit("usage: plot_curves.py OUT.png LABEL=metrics.jsonl [LABEL=metrics.jsonl ...] [--title TEXT]")
    runs = [(a.split("=", 1)[0], curves(a.split("=", 1)[1])) for a in args[1:]]
    fig, ax = plt.subplots(1, 3, figsize=(16, 4.5))
    base = runs[0][1][0]
    for label, (train, valid) in runs:
        its = sorted(train)
        ax[0].plot(its, [train[i] for i in its], label=label, linewidth=1)
        vits = sorted(valid)
        ax[1].plot(vits, [valid[i] for i in vits], marker="o", label=label)
        common = [i for i in its if i in base]
        rel = [(train[i] - base[i]) / base[i] * 100 for i in common]
        smooth = [sum(rel[max(0, k - 4):k + 1]) / len(rel[max(0, k - 4):k + 1]) for k in range(len(rel))]
        ax[2].plot(common, smooth, label=label, linewidth=1)
    ax[0].set(xlabel="iteration", ylabel="training loss", title="training loss")
    ax[1].set(xlabel="iteration", ylabel="validation loss", title="validation loss")
    ax[2].set(xlabel="iteration", ylabel=f"% vs {runs[0][0]}", title=f"training loss vs {runs[0][0]} (5-log mean)")
    ax[2].axhline(0, color="grey", linewidth=0.5)
    for a in ax:
        a.grid(alpha=0.3)
        a.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(args[0], dpi=90)
    print(args[0])


if __name__ == "__main__":
    main()
