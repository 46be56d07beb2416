"""The front as a PNG: accuracy vs predicted latency, front highlighted, budgets drawn."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence


def front_png(*, evaluated: Sequence[Mapping[str, float]], front: Sequence[Mapping[str, float]],
              latency_budgets_ms: Sequence[float], picks: Sequence[Mapping[str, float]] = (),
              other_budgets: str = "", title: str = "") -> bytes:
    """``evaluated`` / ``front`` / ``picks``: rows with ``accuracy`` (0..1) and ``latency_ms``.

    The staircase joins the front's points that are also best in accuracy vs latency
    alone; the other front points are there for energy or memory.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.8), dpi=110)
    try:
        if evaluated:
            ax.scatter([r["latency_ms"] for r in evaluated], [100 * r["accuracy"] for r in evaluated], s=10,
                       color="0.75", label=f"measured ({len(evaluated)}, earlier exits included)", zorder=1)
        if front:
            ax.scatter([r["latency_ms"] for r in front], [100 * r["accuracy"] for r in front], s=28,
                       color="tab:blue", label=f"front ({len(front)})", zorder=3)
            stairs = sorted(front, key=lambda r: (r["latency_ms"], -r["accuracy"]))
            xs, ys, best = [], [], -1.0
            for r in stairs:
                if r["accuracy"] > best:
                    best = r["accuracy"]
                    xs.append(r["latency_ms"])
                    ys.append(100 * best)
            ax.step(xs, ys, where="post", color="tab:blue", lw=1.2, zorder=2)
        for i, budget in enumerate(latency_budgets_ms):
            ax.axvline(budget, color="tab:red", ls="--", lw=1, label="latency budgets" if i == 0 else None)
        if picks:
            ax.scatter([r["latency_ms"] for r in picks], [100 * r["accuracy"] for r in picks], marker="*", s=160,
                       color="tab:orange", edgecolor="k", label="best within each budget", zorder=4)
        ax.set_xlabel("predicted latency (ms)")
        ax.set_ylabel("accuracy on held-out data (%)")
        ax.set_title(title + (f"\n{other_budgets}" if other_budgets else ""), fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", bbox_inches="tight")
    finally:
        plt.close(fig)
    return buffer.getvalue()
