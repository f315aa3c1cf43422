"""Matplotlib set-up shared by every section's figures (headless, consistent style)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

plt.rcParams.update({"figure.dpi": 110, "axes.grid": True, "grid.alpha": 0.3,
                     "axes.spines.top": False, "axes.spines.right": False})


def save(fig: plt.Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def subplots(ncols: int, nrows: int = 1, width: float = 5.0, height: float = 3.8):
    return plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
