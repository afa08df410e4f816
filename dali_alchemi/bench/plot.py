"""The benchmark's bar chart: structures/s per loader and order, with the layout's ``limit`` as a line."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dali_alchemi.bench.names import LAYOUT_ROWS

if TYPE_CHECKING:
    from dali_alchemi.bench.runner import Record

__all__ = ["LIMIT_LABEL", "plot_records"]

LIMIT_LABEL = "limit: the store's codecs on one core\n(crc32c + decode, bytes in memory)"
"""The legend of the ``limit`` line: what it measures, in two short lines."""


def plot_records(records: list[Record], path: str | Path, *, title: str = "") -> Path:
    """Write a PNG bar chart of ``records`` to ``path`` (matplotlib is imported here, lazily)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    bars = [r for r in records if r.loader not in LAYOUT_ROWS and r.samples_per_s]
    loaders = list(dict.fromkeys(r.loader for r in bars))
    orders = list(dict.fromkeys(r.order for r in bars))
    width = 0.8 / max(1, len(orders))
    fig, ax = plt.subplots(figsize=(max(7.0, 1.2 * len(loaders) + 3.5), 4.5))
    for k, order in enumerate(orders):
        xs: list[float] = []
        ys: list[float] = []
        for i, loader in enumerate(loaders):
            rates = [r.samples_per_s for r in bars if r.loader == loader and r.order == order and r.samples_per_s]
            if rates:
                xs.append(i + (k - (len(orders) - 1) / 2) * width)
                ys.append(rates[0])
        drawn = ax.bar(xs, ys, width=width, label=order)
        ax.bar_label(drawn, labels=[f"{y:,.0f}" for y in ys], fontsize=7, rotation=90, padding=2)
    limit = [float(r.samples_per_s) for r in records if r.loader == "limit" and r.samples_per_s is not None]
    if limit:
        ax.axhline(limit[0], color="black", linestyle="--", linewidth=1, label=LIMIT_LABEL)
    missing = [r.loader for r in records if r.note]
    ax.set_xticks(range(len(loaders)), loaders, rotation=20, ha="right")
    ax.set_xlabel("loader (bars: structures/s after the first batch; colours: order)", fontsize=9)
    ax.set_ylabel("structures per second")
    ax.set_ylim(0, 1.25 * max([*(b.samples_per_s or 0.0 for b in bars), *limit, 1.0]))  # room for the labels
    ax.yaxis.set_major_formatter(matplotlib.ticker.StrMethodFormatter("{x:,.0f}"))
    ax.grid(axis="y", alpha=0.4)
    ax.set_axisbelow(True)
    ax.set_title(title + (f"  (not run: {', '.join(sorted(set(missing)))})" if missing else ""), fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
