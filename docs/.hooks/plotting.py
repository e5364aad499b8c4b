"""Plots for the site through matplotlib: SVG with its text kept as text, in a light and a dark variant.

A plot is a drawing function and the data it draws. `figure()` renders it twice
(one palette per Material colour scheme), caches both SVG files under a key
made of the data, the drawing code and matplotlib's version, and returns the
HTML a page shows: two <img>s whose `#only-light` / `#only-dark` suffix lets
Material show the one that matches the reader's scheme, a caption, and the
table of the plotted numbers. The hook (bank_hooks.on_post_build) copies the
files of this build into the site's assets/plots/.

A new plot is a few lines::

    html = plotting.lines("ttft-vs-budget", page_url, {"chunked": (budgets, ttft)},
                          x_label="max_num_batched_tokens", y_label="TTFT p50 (ms)",
                          title="TTFT against the token budget", caption="...", table=table)

or, for anything else, `figure(name, page_url, draw, data, ...)` with
`draw(ax, theme, data)` drawing on one matplotlib Axes.

Readable at every width: each image gets a minimum width at which its smallest
text is 11.5 px on screen; below it, the figure scrolls sideways inside its
frame (docs/javascripts/scroll-cue.js shows that it does) rather than shrink.
"""

from __future__ import annotations

import hashlib
import html
import inspect
import io
import json
import math
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

SITE_FOLDER = "assets/plots"
MIN_TEXT_PX = 11.5  # the smallest text, on screen, at the image's minimum width
PX_PER_PT = 96 / 72  # CSS pixels per point: matplotlib's SVG is sized in points


@dataclass(frozen=True)
class Theme:
    """The colours of one Material scheme. Series colours keep their order across both themes."""

    name: str  # "light" or "dark": Material's #only-light / #only-dark
    text: str
    muted: str
    grid: str
    frame: str
    series: tuple[str, ...]


THEMES = (
    Theme("light", text="#1f2328", muted="#57606a", grid="#d0d7de", frame="#8c959f",
          series=("#3f51b5", "#c2185b", "#00796b", "#e65100", "#6d4c41", "#5e35b1", "#0277bd", "#827717")),
    Theme("dark", text="#e6edf3", muted="#9da7b3", grid="#3d444d", frame="#6e7681",
          series=("#8c9eff", "#f48fb1", "#4db6ac", "#ffb74d", "#bcaaa4", "#b39ddb", "#4fc3f7", "#dce775")),
)

FONT_SIZE = 10.5  # points; tick labels use it too
RC = {
    "svg.fonttype": "none",  # text stays <text>: selectable, searchable, measurable
    "svg.hashsalt": "llm-inference-interview-bank",  # the same ids every build
    "font.family": "sans-serif",
    "font.size": FONT_SIZE,
    "axes.titlesize": FONT_SIZE,
    "axes.labelsize": FONT_SIZE,
    "xtick.labelsize": FONT_SIZE,
    "ytick.labelsize": FONT_SIZE,
    "legend.fontsize": FONT_SIZE,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


class PlotError(ValueError):
    """A plot asked for something its data does not hold."""


# ---------------------------------------------------------------------------
# Rendering and the cache
# ---------------------------------------------------------------------------


@dataclass
class Rendered:
    """One plot's two SVG files, named by content, and the width below which it scrolls."""

    name: str
    files: dict[str, Path]  # theme name -> cached SVG
    width_px: float
    min_width_px: float

    def site_path(self, theme: str) -> str:
        return f"{SITE_FOLDER}/{self.files[theme].name}"


# Files rendered (or found in the cache) during this build: the hook copies them into the site.
BUILT: dict[str, Path] = {}
_STATS = {"rendered": 0, "cached": 0}


def _cache_dir() -> Path:
    import assets  # docs/.hooks/assets.py: the build's one cache folder

    return assets.cache_dir() / "plots"


def _code_fingerprint(draw: Callable) -> str:
    """What the drawing depends on besides its data: its code, this module's, matplotlib's version."""
    import matplotlib

    parts = [inspect.getsource(draw), Path(__file__).read_text(encoding="utf-8"), matplotlib.__version__]
    module = inspect.getmodule(draw)
    if module is not None and getattr(module, "__file__", None):
        parts.append(Path(module.__file__).read_text(encoding="utf-8"))
    return "\n".join(parts)


def cache_key(name: str, draw: Callable, data: Any, size: tuple[float, float]) -> str:
    payload = json.dumps({"name": name, "data": data, "size": size}, sort_keys=True, default=str)
    return hashlib.sha256((payload + _code_fingerprint(draw)).encode()).hexdigest()[:16]


def _smallest_font_pt(svg: str) -> float:
    sizes = [float(s) for s in re.findall(r"font-size:\s*([\d.]+)px", svg)]
    sizes += [float(s) for s in re.findall(r'font-size="([\d.]+)"', svg)]
    return min(sizes) if sizes else FONT_SIZE


def _svg_width_pt(svg: str) -> float:
    match = re.search(r'<svg[^>]*\swidth="([\d.]+)pt"', svg)
    if not match:
        raise PlotError("matplotlib wrote an SVG without a width in points")
    return float(match.group(1))


def _draw_svg(draw: Callable, data: Any, theme: Theme, size: tuple[float, float]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    with matplotlib.rc_context({**RC, "text.color": theme.text, "axes.labelcolor": theme.text,
                                "axes.edgecolor": theme.frame, "xtick.color": theme.muted,
                                "ytick.color": theme.muted, "xtick.labelcolor": theme.text,
                                "ytick.labelcolor": theme.text, "grid.color": theme.grid,
                                "axes.prop_cycle": matplotlib.cycler(color=list(theme.series))}):
        fig, ax = plt.subplots(figsize=size, layout="constrained")
        try:
            draw(ax, theme, data)
            out = io.StringIO()
            fig.savefig(out, format="svg", transparent=True, metadata={"Date": None})
        finally:
            plt.close(fig)
    return out.getvalue()


def render(name: str, draw: Callable, data: Any, size: tuple[float, float] = (6.4, 3.6)) -> Rendered:
    """Both themes' SVG files for `draw(ax, theme, data)`: from the cache when the inputs are unchanged."""
    key = cache_key(name, draw, data, size)
    folder = _cache_dir()
    files = {t.name: folder / f"{name}-{key}-{t.name}.svg" for t in THEMES}
    if all(p.is_file() for p in files.values()):
        _STATS["cached"] += 1
    else:
        folder.mkdir(parents=True, exist_ok=True)
        for theme in THEMES:
            svg = _draw_svg(draw, data, theme, size)
            tmp = files[theme.name].with_suffix(".tmp")
            tmp.write_text(svg, encoding="utf-8")
            tmp.replace(files[theme.name])  # a reader never sees half a file
        _STATS["rendered"] += 1
    svg = files["light"].read_text(encoding="utf-8")
    width_pt = _svg_width_pt(svg)
    # At the minimum width the smallest text (in points, scaled with the image) is MIN_TEXT_PX.
    min_width = math.ceil(width_pt * MIN_TEXT_PX / _smallest_font_pt(svg))
    for path in files.values():
        BUILT[path.name] = path
    return Rendered(name, files, width_pt * PX_PER_PT, min(min_width, width_pt * PX_PER_PT))


def reset_build() -> None:
    BUILT.clear()
    _STATS.update(rendered=0, cached=0)


def stats() -> dict[str, int]:
    return dict(_STATS)


# ---------------------------------------------------------------------------
# HTML for the page
# ---------------------------------------------------------------------------


def _rel(page_url: str, site_path: str) -> str:
    """A link from a page (its URL, as MkDocs gives it: 'reference/rooflines/') to a site file."""
    base = page_url if page_url.endswith("/") or not page_url else posixpath.dirname(page_url) + "/"
    return posixpath.relpath(site_path, base or ".")


def figure_html(rendered: Rendered, page_url: str, title: str, caption: str, table: str = "") -> str:
    """Markdown that keeps a raw HTML figure intact: both variants, the caption, then the table."""
    imgs = []
    for theme in THEMES:
        src = _rel(page_url, rendered.site_path(theme.name))
        imgs.append(
            f'<img class="plot-img" src="{html.escape(src)}#only-{theme.name}" alt="{html.escape(title)}" '
            f'width="{rendered.width_px:.0f}" style="min-width: {rendered.min_width_px:.0f}px" '
            f'data-plot="{html.escape(rendered.name)}">'
        )
    return (
        f'<figure class="plot-figure" data-plot="{html.escape(rendered.name)}">\n'
        f'<div class="plot-scroll" tabindex="0" role="group" aria-label="{html.escape(title)}">'
        + "".join(imgs) + "</div>\n"
        f"<figcaption>{caption}</figcaption>\n</figure>\n\n{table}\n"
    )


def figure(name: str, page_url: str, draw: Callable, data: Any, *, title: str, caption: str,
           table: str = "", size: tuple[float, float] = (6.4, 3.6)) -> str:
    """Render `draw(ax, theme, data)` and return the figure's HTML. `data` must be JSON-able: it is the key."""
    return figure_html(render(name, draw, data, size), page_url, title, caption, table)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Ready-made kinds: lines (with optional reference marks)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Mark:
    """A labelled reference line: a knee, a budget, a ridge. axis 'x' is vertical, 'y' horizontal."""

    axis: str
    value: float
    label: str


@dataclass
class LinesData:
    series: dict[str, tuple[list[float], list[float]]]
    x_label: str
    y_label: str
    log_x: bool = False
    log_y: bool = False
    marks: list[Mark] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"series": self.series, "x_label": self.x_label, "y_label": self.y_label, "log_x": self.log_x,
                "log_y": self.log_y, "marks": [(m.axis, m.value, m.label) for m in self.marks]}


def _plain(v: float) -> str:
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if v >= scale:
            return f"{v / scale:g}{suffix}"
    return f"{v:g}"


def _mantissa(v: float) -> int:
    """The leading digit of a tick value: 2 for 0.2, 20 and 2,000."""
    return round(v / 10 ** math.floor(math.log10(v))) if v > 0 else 0


def draw_lines(ax, theme: Theme, data: dict) -> None:
    colours = {}
    for label, (xs, ys) in data["series"].items():
        # "X floor" pairs with "X measured": same colour, dashed, so the gap reads as one curve against its floor.
        stem, _, kind = label.rpartition(" ")
        if kind == "floor" and stem in colours:
            ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.5, linestyle="--", color=colours[stem],
                    label=label)
            continue
        (line,) = ax.plot(xs, ys, marker="o", markersize=4, linewidth=2, label=label)
        if kind == "measured":
            colours[stem] = line.get_color()
    for axis, value, label in data["marks"]:
        line = ax.axvline if axis == "x" else ax.axhline
        line(value, color=theme.muted, linestyle="--", linewidth=1)
        if axis == "x":
            ax.annotate(label, (value, 1), xycoords=("data", "axes fraction"), xytext=(4, -4),
                        textcoords="offset points", va="top", color=theme.muted)
        else:
            ax.annotate(label, (0, value), xycoords=("axes fraction", "data"), xytext=(4, 4),
                        textcoords="offset points", color=theme.muted)
    from matplotlib.ticker import FuncFormatter, NullFormatter

    # Log axes print plain numbers (64, 1k), not 10^n: readers compare them with the tables.
    plain = FuncFormatter(lambda v, _pos: _plain(v))
    # Minor ticks carry a label only at 2 and 5 times a power of ten: enough to read a value, never crowded.
    sparse = FuncFormatter(lambda v, _pos: _plain(v) if _mantissa(v) in (2, 5) else "")
    if data["log_x"]:
        ax.set_xscale("log")
    if data["log_y"]:
        ax.set_yscale("log")
    for on, axis, limits in ((data["log_x"], ax.xaxis, ax.get_xlim), (data["log_y"], ax.yaxis, ax.get_ylim)):
        if on:
            lo, hi = limits()
            axis.set_major_formatter(plain)
            # Past three decades the powers of ten alone are enough, and minor labels would collide.
            axis.set_minor_formatter(sparse if hi / lo <= 1000 else NullFormatter())
    ax.set_xlabel(data["x_label"])
    ax.set_ylabel(data["y_label"])
    ax.grid(True, linewidth=0.6)
    if len(data["series"]) > 1:
        ax.legend(frameon=False)


def lines(name: str, page_url: str, series: dict[str, tuple[Sequence[float], Sequence[float]]], *,
          x_label: str, y_label: str, title: str, caption: str, table: str = "", log_x: bool = False,
          log_y: bool = False, marks: Sequence[Mark] = (), size: tuple[float, float] = (6.4, 3.6)) -> str:
    """One or more curves y(x), e.g. step time against batch, with labelled reference lines."""
    data = LinesData({k: (list(map(float, xs)), list(map(float, ys))) for k, (xs, ys) in series.items()},
                     x_label, y_label, log_x, log_y, list(marks)).to_json()
    return figure(name, page_url, draw_lines, data, title=title, caption=caption, table=table, size=size)
