"""One look for every figure in the course."""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.ticker import FuncFormatter

from clusterlab.bench import format_bytes

MEASURED_STYLE = {"marker": "o", "linestyle": "-", "linewidth": 1.5, "markersize": 4}
MODEL_STYLE = {"linestyle": "--", "linewidth": 1.5}


def use_course_style() -> None:
    """Set matplotlib defaults shared by chapters and labs."""
    plt.rcParams.update({
        "figure.figsize": (7.0, 4.0),
        "figure.dpi": 100,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "legend.frameon": False,
    })


def bytes_axis(ax: Axes, axis: str = "x") -> None:
    """Log-scale axis labelled in binary units (4 KiB, 1 MiB, ...)."""
    formatter = FuncFormatter(lambda value, _: format_bytes(value))
    if axis == "x":
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(formatter)
    else:
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_formatter(formatter)


def measured_vs_model(ax: Axes, sizes_bytes: Sequence[float], measured: Sequence[float],
                      model: Sequence[float] | None = None, *, label: str = "",
                      color: str | None = None) -> None:
    """Measured points joined by a line, and the model as a dashed line in the same colour."""
    (line,) = ax.plot(sizes_bytes, measured, label=f"{label} measured".strip(), color=color,
                      **MEASURED_STYLE)
    if model is not None:
        ax.plot(sizes_bytes, model, color=line.get_color(), label=f"{label} model".strip(),
                **MODEL_STYLE)
