"""Inline SVG charts for the HTML report: no script, no fonts or images to fetch.

Every chart is a `<svg viewBox=...>` string that scales with the page. Marks carry a `<title>`
(the browser's own tooltip), so the figures behind each bar or point are readable without
JavaScript. All text is escaped: module names come from an untrusted checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

W, H = 960, 300  # viewBox units (px at 100% zoom)
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 30, 44  # the legend sits above the plot
PALETTE = {"q_proj": "#4e79a7", "k_proj": "#59a14f", "v_proj": "#9c755f", "o_proj": "#f28e2b",
           "gate_proj": "#e15759", "up_proj": "#b07aa1", "down_proj": "#76b7b2", "other": "#8c8c8c"}
SERIES = ("#4e79a7", "#e15759", "#59a14f", "#f28e2b")


@dataclass(frozen=True)
class Bar:
    label: str  # tooltip title
    value: float
    group: str  # colour key (PALETTE)


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About n round tick values covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 2.5, 5, 10) if step * m >= raw)
    first = math.floor(lo / step) * step
    return [round(first + i * step, 10) for i in range(n + 3) if first + i * step <= hi + step * 1e-9]


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def _frame(ylo: float, yhi: float, ylabel: str, xlabel: str, cls: str) -> tuple[list[str], callable]:
    """Axes, grid and labels; returns (svg parts, y -> pixel)."""
    ticks = _ticks(ylo, yhi)
    lo, hi = min(ticks[0], ylo), max(ticks[-1], yhi)
    ph = H - TOP - BOTTOM

    def y(v: float) -> float:
        return TOP + ph * (1 - (v - lo) / (hi - lo))

    parts = [f'<svg class="chart {cls}" viewBox="0 0 {W} {H}" role="img" xmlns="http://www.w3.org/2000/svg">',
             f'<rect x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" height="{ph}" class="plot-bg"/>']
    for t in ticks:
        parts.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y(t):.1f}" y2="{y(t):.1f}" class="grid"/>'
                     f'<text x="{LEFT - 6}" y="{y(t) + 4:.1f}" class="tick" text-anchor="end">{_fmt(t)}</text>')
    parts.append(f'<text x="14" y="{TOP + ph / 2:.0f}" class="axis" text-anchor="middle" '
                 f'transform="rotate(-90 14 {TOP + ph / 2:.0f})">{escape(ylabel)}</text>'
                 f'<text x="{(LEFT + W - RIGHT) / 2:.0f}" y="{H - 6}" class="axis" text-anchor="middle">'
                 f'{escape(xlabel)}</text>')
    return parts, y


def value_range(vals: list[float], zero: bool) -> tuple[float, float]:
    """The y range: from 0, or (zero=False, for dB) hugging the data with a little room."""
    lo, hi = min(vals), max(vals)
    if zero:
        return min(0.0, lo), max(0.0, hi)
    pad = max((hi - lo) * 0.15, 0.5)
    return math.floor(lo - pad), math.ceil(hi + pad)


def bar_chart(bars: list[Bar], *, ylabel: str, xlabel: str, groups: list[tuple[int, str]] = (),
              cls: str = "bars", zero: bool = True) -> str:
    """One bar per item, in order, rising from the bottom of the y range (0 when `zero`);
    `groups` = (first index, label) separators along x."""
    if not bars:
        return ""
    lo, hi = value_range([b.value for b in bars], zero)
    parts, y = _frame(lo, hi, ylabel, xlabel, cls)
    pw = (W - LEFT - RIGHT) / len(bars)
    base = y(0.0) if zero else H - BOTTOM
    for start, label in groups:
        x = LEFT + start * pw
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{H - BOTTOM + 4}" class="sep"/>'
                     f'<text x="{x + 3:.1f}" y="{H - BOTTOM + 16}" class="tick">{escape(label)}</text>')
    for i, b in enumerate(bars):
        top, bottom = sorted((y(b.value), base))
        color = PALETTE.get(b.group, PALETTE["other"])
        parts.append(f'<rect class="bar" x="{LEFT + i * pw + pw * 0.1:.2f}" y="{top:.2f}" width="{pw * 0.8:.2f}" '
                     f'height="{max(bottom - top, 0.5):.2f}" fill="{color}"><title>{escape(b.label)}</title></rect>')
    parts.append(legend(sorted({b.group for b in bars}, key=list(PALETTE).index)))
    return "".join(parts) + "</svg>"


def line_chart(series: dict[str, list[tuple[float, float, str]]], *, ylabel: str, xlabel: str,
               cls: str = "lines", xticks: list[tuple[float, str]] = (), zero: bool = True) -> str:
    """Series name -> [(x, y, tooltip)] drawn as polylines with a marker per point."""
    pts = [p for s in series.values() for p in s]
    if not pts:
        return ""
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    parts, y = _frame(*value_range(ys, zero), ylabel, xlabel, cls)
    xlo, xhi = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1

    def x(v: float) -> float:
        return LEFT + 12 + (W - LEFT - RIGHT - 24) * (v - xlo) / (xhi - xlo)

    for v, label in xticks:
        parts.append(f'<text x="{x(v):.1f}" y="{H - BOTTOM + 16}" class="tick" text-anchor="middle">'
                     f'{escape(label)}</text>')
    for k, (name, s) in enumerate(series.items()):
        color = SERIES[k % len(SERIES)]
        path = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b, _ in s)
        parts.append(f'<polyline class="series" points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for a, b, tip in s:
            parts.append(f'<circle class="point" cx="{x(a):.1f}" cy="{y(b):.1f}" r="3.5" fill="{color}">'
                         f'<title>{escape(tip)}</title></circle>')
    parts.append(legend(list(series), colors=SERIES))
    return "".join(parts) + "</svg>"


def legend(names: list[str], colors=None) -> str:
    """A row of swatches in the top-right corner of the plot."""
    out, x = [], W - RIGHT - 8
    for k, name in reversed(list(enumerate(names))):
        color = (colors[k % len(colors)] if colors else PALETTE.get(name, PALETTE["other"]))
        x -= 14 + 7 * len(name)
        out.append(f'<rect x="{x}" y="{TOP - 20}" width="10" height="10" fill="{color}"/>'
                   f'<text x="{x + 14}" y="{TOP - 11}" class="legend">{escape(name)}</text>')
    return f'<g class="legend-box">{"".join(out)}</g>'
