"""Hand-written SVG chart of bench/run.py's results (no plotting library).

One row per model: on the left, decode tokens/s of each engine (median, whiskers min–max) with the
memory-bandwidth ceiling marked as a dashed line; on the right, prefill tokens/s. Each row has its
own scale (models differ by 10×), so bar lengths compare engines within a model.
"""
from __future__ import annotations

from html import escape

COLORS = {"kasoku": "#d9480f", "llama.cpp": "#1c7ed6"}
ENGINES = ["kasoku", "llama.cpp"]


def svg(r: dict) -> str:
    models = [m for m in r["models"] if "metrics" in m]
    gen = r["settings"]["gen"][0] if r["settings"]["gen"] else None
    W, left, colw, gap = 980, 190, 330, 60
    bar_h, row_h, top = 16, 64, 70
    H = top + row_h * max(1, len(models)) + 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
           f'font-family="Helvetica, Arial, sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="15" font-weight="bold">'
           f'kasoku vs llama.cpp — tokens/s, {r["settings"]["threads"]} threads'
           f'{" (quick run)" if r["settings"].get("quick") else ""}</text>',
           f'<text x="{left + colw / 2}" y="50" text-anchor="middle" font-weight="bold">decode {gen} tokens '
           f'(dashed: bandwidth ceiling)</text>',
           f'<text x="{left + colw + gap + colw / 2}" y="50" text-anchor="middle" font-weight="bold">'
           f'prefill {r["settings"]["prompt_tokens"]} tokens</text>']
    # legend
    lx = W - 200
    for i, eng in enumerate(ENGINES):
        out.append(f'<rect x="{lx + i * 95}" y="{H - 26}" width="12" height="12" fill="{COLORS[eng]}"/>')
        out.append(f'<text x="{lx + i * 95 + 16}" y="{H - 16}">{eng}</text>')
    if not models:
        out.append(f'<text x="{W / 2}" y="{top + 30}" text-anchor="middle">no measured models</text>')
    for row, m in enumerate(models):
        y0 = top + row * row_h
        mt = m["metrics"]
        out.append(f'<text x="{left - 10}" y="{y0 + row_h / 2 - 4}" text-anchor="end" font-weight="bold">'
                   f'{escape(m["name"])}</text>')
        if row % 2 == 0:
            out.insert(2, f'<rect x="0" y="{y0 - 6}" width="{W}" height="{row_h}" fill="#f6f7f9"/>')
        dec = mt.get(f"decode_{gen}", {}) if gen else {}
        ceiling = (dec.get("ceiling") or {}).get("tokens_per_second")
        out += _bars(dec, left, y0, colw, bar_h, ceiling)
        out += _bars(mt.get("prefill", {}), left + colw + gap, y0, colw, bar_h, None)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _bars(metric: dict, x0: float, y0: float, width: float, bar_h: float, ceiling: float | None) -> list[str]:
    vals = [metric.get(e) for e in ENGINES]
    top = max([v["max"] for v in vals if v] + ([ceiling] if ceiling else []) + [1e-9]) * 1.12
    scale = (width - 70) / top
    out = [f'<line x1="{x0}" y1="{y0 - 2}" x2="{x0}" y2="{y0 + 2 * bar_h + 10}" stroke="#555"/>']
    for i, (eng, v) in enumerate(zip(ENGINES, vals)):
        y = y0 + i * (bar_h + 6)
        if not v:
            out.append(f'<text x="{x0 + 4}" y="{y + bar_h - 4}" fill="#888">{eng}: not measured</text>')
            continue
        w = v["median"] * scale
        out.append(f'<rect x="{x0}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{COLORS[eng]}"/>')
        if v["n"] > 1:
            cy = y + bar_h / 2
            out.append(f'<line x1="{x0 + v["min"] * scale:.1f}" y1="{cy}" x2="{x0 + v["max"] * scale:.1f}" '
                       f'y2="{cy}" stroke="black" stroke-width="1"/>')
        label = f'{v["median"]:.1f}'
        if "fraction_of_ceiling" in v:
            label += f' ({100 * v["fraction_of_ceiling"]:.0f}%)'
        out.append(f'<text x="{x0 + max(w, v["max"] * scale) + 4:.1f}" y="{y + bar_h - 4}">{label}</text>')
    if ceiling:
        cx = x0 + ceiling * scale
        out.append(f'<line x1="{cx:.1f}" y1="{y0 - 4}" x2="{cx:.1f}" y2="{y0 + 2 * bar_h + 10}" stroke="#2b8a3e" '
                   f'stroke-width="2" stroke-dasharray="4,3"/>')
        out.append(f'<text x="{cx:.1f}" y="{y0 + 2 * bar_h + 22}" text-anchor="middle" fill="#2b8a3e" '
                   f'font-size="10">ceiling {ceiling:.1f}</text>')
    return out
