"""The figure of ``fedcore plot``: its panels, curve styles, axes and legend
(matplotlib, imported when drawing)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from fedcore.errors import ConfigError
from fedcore.plotting.curves import _Curve, _curves, _timed
from fedcore.plotting.runs import expand_runs, grid_keys

_DPI = 100
"""The picture's resolution (the figure's too, so that it is laid out as it is drawn)."""

LEGEND_OUTSIDE = 6
"""From this many curves on (or with labels of over 40 characters), the legend goes below
the panels, off the curves."""


_COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
"""matplotlib's ``tab10``, whatever the user's style says."""

_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "<", ">", "h")
_LINESTYLES = ("-", "-.", ":")
"""Solid for the first ten curves, then the next (dashed is the mean node accuracy's)."""


def curve_style(i: int) -> dict[str, Any]:
    """Curve ``i``'s colour, marker and line style: no two alike among the first 330."""
    return {
        "color": _COLORS[i % len(_COLORS)],
        "marker": _MARKERS[i % len(_MARKERS)],
        "linestyle": _LINESTYLES[i // len(_COLORS) % len(_LINESTYLES)],
    }


def _bytes_differ_tenfold(curves: Sequence[_Curve]) -> bool:
    """Whether the runs' bytes differ more than ten times (of runs that sent any)."""
    sent = [c.mb for c in curves if c.mb > 0]
    return len(sent) > 1 and max(sent) > 10 * min(sent)


def _legend_columns(labels: Sequence[str]) -> int:
    """As many columns (up to 4) as labels this long fit across the figure (some 170
    characters of the small font, less a handle of 8 a column)."""
    return max(1, min(4, 170 // (max(len(text) for text in labels) + 8)))


def _draw(
    ax: Any,
    xs: Sequence[float],
    ys: Sequence[float],
    spread: Sequence[float] | None,
    *,
    positive_x: bool,
    **style: Any,
) -> Any:
    """One line (and its band) on ``ax``; points at x <= 0 left out on a log axis; markers
    on every point of a short line, about a dozen along a long one."""
    keep = [i for i, x in enumerate(xs) if x > 0 or not positive_x]
    x = [xs[i] for i in keep]
    y = [ys[i] for i in keep]
    drawn = sum(not (math.isnan(a) or math.isnan(b)) for a, b in zip(x, y, strict=True))
    # By distance: even on a log axis (matplotlib cannot place them on a line of no point).
    every = 0.08 if drawn > 12 else None
    (line,) = ax.plot(x, y, markevery=every, markersize=4, **style)
    if spread is not None and x:
        low = [y[j] - spread[i] for j, i in enumerate(keep)]
        high = [y[j] + spread[i] for j, i in enumerate(keep)]
        alpha = 0.1 if style.get("linestyle") == "--" else 0.2
        ax.fill_between(x, low, high, color=line.get_color(), alpha=alpha, linewidth=0)
    return line


def plot_runs(
    run_dirs: Sequence[Path],
    out: Path,
    *,
    label: str | None = None,
    title: str | None = None,
    log_bytes: bool | None = None,
    bands: bool = False,
    time: bool | None = None,
) -> Path:
    """Draw the comparison panels for ``run_dirs`` into ``out`` (PNG, PDF or SVG).

    Args:
        run_dirs: Run folders, or sweep folders (their completed runs).
        out: The picture to write (its format by its suffix).
        label: A dotted config key (``algorithm.name``), or several joined by commas:
            label each curve by their values in the run's ``config.toml`` instead of by
            what differs between the runs (:func:`default_labels`). Grid folders without
            ``label``: by the grid's keys (and ``run.seed`` without ``bands``).
        title: The figure's title (default: :func:`default_title`).
        log_bytes: A log scale on the bytes-sent axes (points at 0 bytes left out);
            None: when the runs' bytes differ more than ten times.
        bands: One curve per group of runs that differ only in ``run.seed``: the mean
            over seeds in a band of +- one standard deviation.
        time: Two more panels, loss and accuracy against virtual seconds (``[time]``);
            None: when every run has virtual time.

    Raises:
        ConfigError: a folder that is not a run, a run without ``config.toml`` or
            without ``label``, runs of a band that share no evaluation round.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    if label is None and (keys := grid_keys([Path(d) for d in run_dirs])):
        label = ",".join(keys if bands else [*keys, "run.seed"])  # a grid's runs by cell
    curves, with_regret, default = _curves(expand_runs([Path(d) for d in run_dirs]), label, bands)
    if log_bytes is None:
        log_bytes = _bytes_differ_tenfold(curves)
    timed = all(_timed(c) for c in curves)
    if time and not timed:
        raise ConfigError(
            "fedcore plot --time: some of the runs have no virtual time (runs with [time], "
            "or deadline mode in fedcore simulate, have it); leave out --time."
        )
    time = timed if time is None else time
    labels = [c.label for c in curves]
    # Many curves, or long names, would hide the curves: the legend goes below instead.
    outside = len(curves) >= LEGEND_OUTSIDE or max(len(text) for text in labels) > 40
    rows = 2 + int(with_regret) + int(time)
    shape = (rows, time, with_regret)
    fig, axes = _spare_figure(shape)
    if fig is None:
        # The object API: no pyplot, no figure manager, nothing global to set or close.
        fig = Figure(figsize=(11, 3.75 * rows), dpi=_DPI)
        FigureCanvasAgg(fig)
        axes = fig.subplots(rows, 2)
    mb = "MB sent per node" + (" (log)" if log_bytes else "")
    styles = [curve_style(i) for i in range(len(curves))]
    handles: list[Any] = []
    for ax, by_bytes in ((axes[0][0], False), (axes[1][0], True)):
        positive = by_bytes and log_bytes
        for c, style in zip(curves, styles, strict=True):
            line = _draw(
                ax,
                c.loss.mb if by_bytes else c.loss.rounds,
                c.loss.loss,
                c.loss.spread,
                positive_x=positive,
                label=c.label,
                **style,
            )
            if not by_bytes:
                handles.append(line)
    for ax, by_bytes in ((axes[0][1], False), (axes[1][1], True)):
        positive = by_bytes and log_bytes
        for c, style in zip(curves, styles, strict=True):
            xs = [b / 1e6 for b in c.series["bytes_sent_per_node"]] if by_bytes else c.rounds
            sd = c.spread
            for key, extra in (
                ("avg_model_accuracy", {}),
                ("mean_node_accuracy", {"linestyle": "--", "markerfacecolor": "none"}),
            ):
                _draw(
                    ax,
                    xs,
                    c.series[key],
                    sd[key] if sd else None,
                    positive_x=positive,
                    label=c.label if not extra else f"{c.label} (mean node)",
                    **{**style, **extra},
                )
    for ax, by_bytes, ylabel in (
        (axes[0][0], False, "training loss"),
        (axes[0][1], False, "test accuracy"),
        (axes[1][0], True, "training loss"),
        (axes[1][1], True, "test accuracy"),
    ):
        if by_bytes and log_bytes and any(ln.get_xdata().size for ln in ax.get_lines()):
            ax.set_xscale("log")
        ax.set_xlabel(mb if by_bytes else "round")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    dashed_text = "dashed: mean node accuracy"
    dashed = Line2D([], [], color="grey", linestyle="--", label=dashed_text)
    if not outside:
        axes[0][1].legend(handles=[*handles, dashed], loc="lower right", fontsize="small")
    if time:
        _time_panels(axes[2], curves, styles)
    if with_regret:
        row = axes[3 if time else 2]
        for ax, key, ylabel in (
            (row[0], "average_static_regret", "average static regret R_t / (n t)"),
            (row[1], "average_dynamic_regret", "average dynamic regret"),
        ):
            for c, style in zip(curves, styles, strict=True):
                if key in c.regret:
                    rx, ry, rsd = c.regret[key]
                    _draw(ax, rx, ry, rsd, positive_x=False, label=c.label, **style)
            ax.set_xlabel("round")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
        if not outside:
            row[0].legend(fontsize="small")
    fig.suptitle(title or default)
    fig.tight_layout()
    # No layout engine left (tight_layout leaves a placeholder one): with one, savefig would
    # first draw the whole figure unseen, one more pass over every tick and label.
    fig.set_layout_engine(None)
    if outside:
        fig.legend(
            handles=[*handles, dashed],
            loc="upper center",
            bbox_to_anchor=(0.5, 0.0),
            ncol=_legend_columns([*labels, dashed_text]),
            fontsize="small",
            frameon=False,
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=_DPI, bbox_inches=_tight_box(fig, out))
    _keep_spare(shape, fig, axes)
    return out


_spares: dict[tuple[int, bool, bool], list[tuple[Any, Any]]] = {}
"""Inside :func:`recycling`: figures drawn and saved, emptied of their curves, by shape
(rows, time panels, regret panels), for the next picture of that shape."""

_recycling: list[bool] = []


@contextlib.contextmanager
def recycling() -> Iterator[None]:
    """Inside: :func:`plot_runs` draws on a figure it drew before (of the same shape, its
    curves and legends taken off, its subplot parameters the defaults again) instead of
    building a new one, keeping its axes and their ticks, and keeps the figure for the
    next picture: the same picture, byte for byte, for about a fifth less of the time.
    A figure with a log axis is not kept. Outside, every picture is drawn on a new figure
    (which a caller may keep: the tests look at the figures they drew)."""
    _recycling.append(True)
    try:
        yield
    finally:
        _recycling.pop()


def _spare_figure(shape: tuple[int, bool, bool]) -> tuple[Any, Any]:
    """A kept figure of ``shape`` and its axes, ready to draw on; (None, None): none."""
    spares = _spares.get(shape) if _recycling else None
    if not spares:
        return None, None
    from matplotlib.figure import SubplotParams

    fig, axes = spares.pop()
    blank = SubplotParams()  # a new figure's, from which tight_layout starts
    fig.subplots_adjust(
        left=blank.left,
        right=blank.right,
        bottom=blank.bottom,
        top=blank.top,
        wspace=blank.wspace,
        hspace=blank.hspace,
    )
    return fig, axes


def _keep_spare(shape: tuple[int, bool, bool], fig: Any, axes: Any) -> None:
    """Keep a saved figure for the next picture of ``shape`` (inside :func:`recycling`):
    its curves and legends taken off; not one with a log axis."""
    if not _recycling or _spares.get(shape):
        return
    if any(ax.get_xscale() != "linear" or ax.get_yscale() != "linear" for ax in axes.flat):
        return
    for ax in axes.flat:
        for artist in [*ax.lines, *ax.collections, *ax.patches, *ax.texts]:
            artist.remove()
        if (legend := ax.get_legend()) is not None:
            legend.remove()
        ax.relim()
    for legend in list(fig.legends):
        legend.remove()
    _spares.setdefault(shape, []).append((fig, axes))


def _tight_box(fig: Any, out: Path) -> Any:
    """The area ``savefig(bbox_inches="tight")`` would save: for a PNG, measured here with
    the canvas's own renderer (one pass over the ticks and labels, where "tight" would first
    draw the whole figure unseen and then measure it: two). PDF and SVG keep "tight" (their
    renderers measure text their own way)."""
    if out.suffix.lower() != ".png":
        return "tight"
    from matplotlib import rcParams

    box = fig.get_tightbbox(fig.canvas.get_renderer())
    return box.padded(rcParams["savefig.pad_inches"])


def _time_panels(row: Any, curves: Sequence[_Curve], styles: Sequence[dict[str, Any]]) -> None:
    """Training loss and test accuracy against virtual seconds."""
    for c, style in zip(curves, styles, strict=True):
        loss = c.loss
        keep = [i for i, v in enumerate(loss.vtime) if not math.isnan(v)]
        _draw(
            row[0],
            [loss.vtime[i] for i in keep],
            [loss.loss[i] for i in keep],
            [loss.spread[i] for i in keep] if loss.spread else None,
            positive_x=False,
            label=c.label,
            **style,
        )
        sd = c.spread
        for key, extra in (
            ("avg_model_accuracy", {}),
            ("mean_node_accuracy", {"linestyle": "--", "markerfacecolor": "none"}),
        ):
            _draw(
                row[1],
                c.series["vtime"],
                c.series[key],
                sd[key] if sd else None,
                positive_x=False,
                label=c.label,
                **{**style, **extra},
            )
    for ax, ylabel in ((row[0], "training loss"), (row[1], "test accuracy")):
        ax.set_xlabel("virtual seconds")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
