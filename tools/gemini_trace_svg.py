#!/usr/bin/env python3
"""Plot a Gemini trace (gpt2_train --trace PATH) as an SVG: bytes per memory tier over time.

Usage: tools/gemini_trace_svg.py TRACE.json OUT.svg [--from-ms A --to-ms B]

Each counter series of the trace ("device in use": everything on the device; "device chunks":
Gemini's gathered and device-homed chunks; "host chunks": chunk bytes in host RAM) becomes a step
line; chunk gathers and evictions are ticks along the bottom. Standard library only.
"""
import argparse
import json

COLOURS = {"device in use": "#d62728", "device chunks": "#1f77b4", "host chunks": "#2ca02c"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--from-ms", type=float, default=None)
    ap.add_argument("--to-ms", type=float, default=None)
    a = ap.parse_args()
    try:
        with open(a.trace) as f:
            events = json.load(f)["traceEvents"]
    except OSError as e:
        raise SystemExit(f"gemini_trace_svg: cannot read '{a.trace}': {e.strerror}")
    except (ValueError, KeyError, TypeError):
        raise SystemExit(f"gemini_trace_svg: '{a.trace}' is not a trace of gpt2_train --trace "
                         "(a JSON object with traceEvents)")
    series, ticks = {}, []
    for e in events:
        t = e["ts"] / 1000.0
        if (a.from_ms is not None and t < a.from_ms) or (a.to_ms is not None and t > a.to_ms):
            continue
        if e["ph"] == "C":
            series.setdefault(e["name"], []).append((t, e["args"]["bytes"] / 2**20))
        elif e.get("cat") in ("move", "evict"):
            ticks.append((t, e["cat"]))
    if not series:
        raise SystemExit("no counter samples in the trace (or in the window)")
    t0 = min(p[0] for s in series.values() for p in s)
    t1 = max(p[0] for s in series.values() for p in s)
    top = max(p[1] for s in series.values() for p in s) * 1.05 or 1.0
    W, H, L, B = 900, 420, 70, 50
    x = lambda t: L + (t - t0) / max(t1 - t0, 1e-9) * (W - L - 20)
    y = lambda v: H - B - v / top * (H - B - 30)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<line x1="{L}" y1="{H-B}" x2="{W-20}" y2="{H-B}" stroke="black"/>',
           f'<line x1="{L}" y1="30" x2="{L}" y2="{H-B}" stroke="black"/>',
           f'<text x="{L}" y="20">MiB per tier over {t1 - t0:.0f} ms</text>',
           f'<text x="{W/2}" y="{H-12}">time (ms)</text>']
    for k in range(5):
        v = top * k / 4
        out.append(f'<text x="5" y="{y(v)+4:.1f}">{v:.0f}</text>')
        out.append(f'<line x1="{L}" y1="{y(v):.1f}" x2="{W-20}" y2="{y(v):.1f}" stroke="#eee"/>')
    for k, (name, pts) in enumerate(sorted(series.items())):
        pts.sort()
        path, last = [], None
        for t, v in pts:
            if last is not None:
                path.append(f"L{x(t):.1f},{y(last):.1f}")
            path.append(("M" if last is None else "L") + f"{x(t):.1f},{y(v):.1f}")
            last = v
        colour = COLOURS.get(name, "#9467bd")
        out.append(f'<path d="{" ".join(path)}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
        out.append(f'<text x="{W-220}" y="{45+16*k}" fill="{colour}">{name}</text>')
    for t, cat in ticks:
        colour = "#ff7f0e" if cat == "evict" else "#7f7f7f"
        out.append(f'<line x1="{x(t):.1f}" y1="{H-B}" x2="{x(t):.1f}" y2="{H-B+8}" stroke="{colour}"/>')
    out.append("</svg>")
    try:
        with open(a.out, "w") as f:
            f.write("\n".join(out) + "\n")
    except OSError as e:
        raise SystemExit(f"gemini_trace_svg: cannot write '{a.out}': {e.strerror}")


if __name__ == "__main__":
    main()
