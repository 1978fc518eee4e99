"""Figures by matplotlib's object API: a ``Figure`` saved through the Agg canvas, no pyplot state
(so plotting in a worker process or a test touches no global backend)."""

from __future__ import annotations

from pathlib import Path


def figure(ncols: int, width: float = 5.0, height: float = 3.8, **subplots):
    """(figure, its ``ncols`` panels in one row), each panel ``width`` x ``height`` inches."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols, height), layout="constrained")
    return fig, fig.subplots(1, ncols, squeeze=False, **subplots)[0]


def save_figures(figures: dict, out: Path, dpi: int = 110) -> list[str]:
    """Each figure of ``{file name: Figure or None}`` as ``out/name`` (PNG by its suffix); the names saved."""
    saved = [name for name, fig in figures.items() if fig is not None]
    for name in saved:
        figures[name].savefig(Path(out) / name, dpi=dpi)
    return saved
