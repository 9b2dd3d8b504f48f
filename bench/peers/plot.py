"""The PNG of a bench.peers result: examples/s per system and model, and test accuracy against
wall time since launch. Runs in the peers' virtualenv (it has matplotlib; Shoal's does not):

    bench/.peers-venv/bin/python bench/peers/plot.py RESULT.json OUT.png
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(argv: list[str]) -> int:
    result_path, out_path = argv
    with open(result_path) as f:
        result = json.load(f)
    summary = [s for s in result["results"] if s.get("examples_per_s")]
    models = list(dict.fromkeys(s["model"] for s in summary))
    systems = list(dict.fromkeys(s["system"] for s in summary))
    fig, axes = plt.subplots(1, 1 + len(models), figsize=(6 + 6 * len(models), 5))
    bars = axes[0]
    width = 0.8 / max(1, len(models))
    for i, model in enumerate(models):
        values = {s["system"]: s["examples_per_s"] for s in summary if s["model"] == model}
        xs = [j + i * width for j in range(len(systems))]
        bars.bar(xs, [values.get(s, 0) for s in systems], width, label=model)
    bars.set_xticks([j + width * (len(models) - 1) / 2 for j in range(len(systems))])
    bars.set_xticklabels(systems, rotation=35, ha="right")
    bars.set_ylabel("examples/s (median)")
    bars.set_title("throughput, 2 workers x batch 100")
    bars.legend()
    for ax, model in zip(axes[1:], models):
        for system in systems:
            runs = [r for r in result["runs"] if r.get("phase") == "compare" and r["system"] == system
                    and r["model"] == model and r.get("ok") and r.get("accuracy_curve")]
            if not runs:
                continue
            curve = sorted(runs[-1]["accuracy_curve"])
            ax.plot([t for t, _ in curve], [a for _, a in curve], marker="o", markersize=3, label=system)
        ax.axhline(0.90, color="grey", linestyle=":", linewidth=1)
        ax.set_ylim(0.80, 1.0)
        ax.set_xlabel("seconds since launch")
        ax.set_ylabel("test accuracy")
        ax.set_title(f"{model}: test accuracy vs wall time (last round)")
        ax.legend(fontsize=8)
    fig.suptitle(f"bench.peers {result['machine'].get('date', '')}, {result['machine'].get('cpus')} cores")
    fig.tight_layout()
    fig.savefig(out_path, dpi=90)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
