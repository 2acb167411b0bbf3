"""Plot bus bandwidth against message size from the text output of benchmarks/gpu_jax.py, as SVG.

    .venv/bin/python -P benchmarks/plot_busbw.py docs/data/gpu_jax_2xh200.txt \\
        -o docs/img/busbw_2xh200.svg [--min-bytes 65536] [--title TEXT]

One panel per collective; one line per library (jax.lax, jax_rccl: colour) and mode (call solid,
loop dashed, unrolled dotted). Standard library only; FAIL / missing values are skipped.
"""

from __future__ import annotations

import argparse
import math
import re
from xml.sax.saxutils import escape

PANEL_W, PANEL_H, CAPTION_H = 420, 300, 28
LEFT, RIGHT, TOP, BOTTOM = 52, 14, 30, 40  # margins of the plot area inside a panel
COLOURS = {"lax": "#1f77b4", "jax_rccl": "#d62728"}
NAMES = {"lax": "jax.lax", "jax_rccl": "jax_rccl"}
DASHES = {"call": "none", "loop": "6 4", "unrolled": "2 3"}
SECTION = re.compile(r"^## (\w+), mode (\w+):")
DEVICES = re.compile(r"^# devices: n = (\d+), .*kind (['\"])(.*)\2")

Series = dict[tuple[str, str], list[tuple[int, float]]]  # (library, mode) -> [(bytes, GB/s)]


def parse(text: str, min_bytes: int) -> tuple[dict[str, Series], str, str]:
    """Busbw points per collective, the "# devices:" line, and a short device name ("2 x H200")."""
    data: dict[str, Series] = {}
    caption = device = ""
    coll = mode = ""
    for line in text.splitlines():
        if m := SECTION.match(line):
            coll, mode = m.groups()
            data.setdefault(coll, {})
        elif m := DEVICES.match(line):
            caption = line.lstrip("# ").strip()
            device = f"{m[1]} x {m[3].removeprefix('NVIDIA ').removeprefix('AMD ')}"
        parts = line.split("|", 3)  # size count | times ratio | busbw | errors [FAIL: ...]
        head = parts[0].split()
        if not coll or len(parts) < 4 or len(head) != 2 or not head[0].isdigit():
            continue
        size = int(head[0])
        if size < min_bytes:
            continue
        for lib, value in zip(("lax", "jax_rccl"), parts[2].split(), strict=False):
            try:
                data[coll].setdefault((lib, mode), []).append((size, float(value)))
            except ValueError:  # "FAIL" or "-"
                pass
    return data, caption, device


def size_label(exp: int) -> str:
    for shift, unit in ((30, "G"), (20, "M"), (10, "K")):
        if exp >= shift:
            return f"{2 ** (exp - shift)}{unit}"
    return f"{2**exp}B"


def x_ticks(lo: int, hi: int) -> list[int]:
    """Exponents of 2 in [lo, hi], multiples of the smallest step that gives at most 8 ticks."""
    for step in (1, 2, 4, 5, 10):
        ticks = [e for e in range(lo, hi + 1) if e % step == 0]
        if len(ticks) <= 8:
            return ticks
    return [lo, hi]


def y_axis(top: float) -> tuple[float, float]:
    """A round tick step and the axis maximum (a multiple of it, >= top), at most 6 intervals."""
    mag = 10 ** math.floor(math.log10(top)) if top > 0 else 1
    for mult in (0.1, 0.2, 0.25, 0.5, 1, 2, 2.5, 5, 10):
        step = mult * mag
        if math.ceil(top / step) <= 6:
            break
    return step, step * max(1, math.ceil(top / step))


def panel(
    title: str, series: Series, ox: float, xr: tuple[float, float], ys: float, ym: float
) -> list[str]:
    """SVG elements of one panel at x offset ox: x range xr in log2 bytes, y step ys, max ym."""
    w, h = PANEL_W - LEFT - RIGHT, PANEL_H - TOP - BOTTOM
    x0, y0 = ox + LEFT, CAPTION_H + TOP  # top left corner of the plot area

    def px(log2_size: float) -> float:
        return x0 + (log2_size - xr[0]) / (xr[1] - xr[0]) * w

    def py(bw: float) -> float:
        return y0 + h - bw / ym * h

    out = [
        f'<text x="{x0 + w / 2:.1f}" y="{y0 - 12}" text-anchor="middle" '
        f'font-size="13" font-weight="bold">{escape(title)}</text>'
    ]
    for i in range(round(ym / ys) + 1):
        y = py(i * ys)
        out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + w}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{i * ys:g}</text>')
    for e in x_ticks(math.ceil(xr[0]), math.floor(xr[1])):
        x = px(e)
        out.append(f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y0 + h}" stroke="#eee"/>')
        out.append(
            f'<text x="{x:.1f}" y="{y0 + h + 15}" text-anchor="middle">{size_label(e)}</text>'
        )
    out.append(f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#444"/>')
    out.append(
        f'<text x="{x0 + w / 2:.1f}" y="{y0 + h + 32}" text-anchor="middle">'
        "message size (bytes, log scale)</text>"
    )
    out.append(
        f'<text transform="translate({ox + 14},{y0 + h / 2:.1f}) rotate(-90)" '
        'text-anchor="middle">busbw (GB/s)</text>'
    )
    for (lib, mode), pts in series.items():
        style = f'stroke="{COLOURS[lib]}" stroke-width="1.6" stroke-dasharray="{DASHES[mode]}"'
        xy = [(px(math.log2(s)), py(bw)) for s, bw in sorted(pts)]
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
        out.append(f'<polyline points="{coords}" fill="none" {style}/>')
        fill = COLOURS[lib] if mode == "call" else "white"
        out += [
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.6" fill="{fill}" stroke="{COLOURS[lib]}"/>'
            for x, y in xy
        ]
    lx, ly = x0 + 8, y0 + 8
    out.append(
        f'<rect x="{lx}" y="{ly}" width="128" height="{8 + 15 * len(series)}" '
        'fill="white" fill-opacity="0.85" stroke="#bbb"/>'
    )
    for i, (lib, mode) in enumerate(series):
        y = ly + 12 + 15 * i
        fill = COLOURS[lib] if mode == "call" else "white"
        out.append(
            f'<line x1="{lx + 6}" y1="{y}" x2="{lx + 32}" y2="{y}" stroke="{COLOURS[lib]}" '
            f'stroke-width="1.6" stroke-dasharray="{DASHES[mode]}"/>'
        )
        out.append(
            f'<circle cx="{lx + 19}" cy="{y}" r="2.6" fill="{fill}" stroke="{COLOURS[lib]}"/>'
        )
        out.append(f'<text x="{lx + 38}" y="{y + 4}">{NAMES[lib]} {mode}</text>')
    return out


def render(data: dict[str, Series], caption: str, device: str) -> str:
    """The whole SVG document: a caption line above one panel per collective, side by side."""
    sizes = [s for series in data.values() for pts in series.values() for s, _ in pts]
    top = max(bw for series in data.values() for pts in series.values() for _, bw in pts)
    xr = (math.log2(min(sizes)) - 0.4, math.log2(max(sizes)) + 0.4)
    ys, ym = y_axis(top)
    width, height = PANEL_W * len(data), CAPTION_H + PANEL_H
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="10" y="19" font-size="13">{escape(caption)}</text>',
    ]
    order = {m: k for k, m in enumerate(DASHES)}
    for i, (coll, series) in enumerate(data.items()):
        ordered = dict(sorted(series.items(), key=lambda kv: (order[kv[0][1]], kv[0][0] != "lax")))
        title = f"{coll}, {device}" if device else coll
        out += panel(title, ordered, i * PANEL_W, xr, ys, ym)
    return "\n".join([*out, "</svg>", ""])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("input", help="a saved output of benchmarks/gpu_jax.py")
    ap.add_argument("-o", "--output", required=True, help="the SVG file to write")
    ap.add_argument("--min-bytes", type=int, default=65536, help="plot sizes >= this only")
    ap.add_argument(
        "--title", help="caption line above the panels (default: the '# devices:' line)"
    )
    args = ap.parse_args()
    with open(args.input) as f:
        data, caption, device = parse(f.read(), args.min_bytes)
    data = {coll: series for coll, series in data.items() if series}
    if not data:
        raise SystemExit(f"{args.input}: no busbw values for sizes >= {args.min_bytes} B")
    with open(args.output, "w") as f:
        f.write(render(data, args.title or caption, device))


if __name__ == "__main__":
    main()
