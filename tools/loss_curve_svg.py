#!/usr/bin/env python3
"""Plot a training run's losses (gpt2_train --log PATH) as an SVG: train and validation loss per step.

Usage: tools/loss_curve_svg.py LOG.jsonl OUT.svg [--smooth N] [--title TEXT]

The train loss of every step is a thin line, its mean over the last N steps (default 20, 1 for
none) a thick one; each evaluation's val loss is a dot on a line, and the evaluations that
--save-best saved are ringed (the log marks them "best"). Where the val loss turns up while the
train loss keeps falling, the model has begun to learn its training text rather than the language:
docs/training.md, "Keeping the best model, and stopping early". A resumed run's log (the steps
after the checkpoint rewritten) plots as one run. Standard library only.
"""
import argparse
import json
import math

W, H, LEFT, RIGHT, TOP, BOTTOM = 860, 420, 64, 24, 36, 48
TRAIN, SMOOTH, VAL = "#9ecae1", "#1f77b4", "#d62728"


def read_log(path):
    """({step: train loss}, {step: (val loss, best)}) of a gpt2_train --log file."""
    train, val = {}, {}
    try:
        with open(path, "rb") as f:  # bytes: a binary file is named below, not a traceback
            lines = f.read().decode("utf-8", errors="replace").splitlines()
    except OSError as e:
        raise SystemExit(f"loss_curve_svg: cannot read '{path}': {e.strerror}")
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            step = int(r["step"])
        except (ValueError, KeyError, TypeError):
            raise SystemExit(f"loss_curve_svg: '{path}' line {n} is not a record of "
                             "gpt2_train --log (a JSON object with a step)")
        if isinstance(r.get("val_loss"), (int, float)):
            val[step] = (float(r["val_loss"]), bool(r.get("best")))
        elif isinstance(r.get("loss"), (int, float)):
            train[step + 1] = float(r["loss"])  # the loss of the update that makes step + 1
    if not train and not val:
        raise SystemExit(f"loss_curve_svg: '{path}' holds no losses")
    return train, val


def smoothed(points, n):
    out, window, total = [], [], 0.0
    for x, y in points:
        window.append(y)
        total += y
        if len(window) > n:
            total -= window.pop(0)
        out.append((x, total / len(window)))
    return out


def ticks(lo, hi, count=6):
    """Round tick values covering [lo, hi]."""
    span = hi - lo or abs(hi) or 1.0
    raw = span / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    values = (first + i * step for i in range(int((hi - first) / step) + 2))
    return [round(v, 12) for v in values if v <= hi + step / 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("out")
    ap.add_argument("--smooth", type=int, default=20)
    ap.add_argument("--title", default=None)
    a = ap.parse_args()
    if a.smooth < 1:
        raise SystemExit("loss_curve_svg: --smooth must be at least 1")
    train, val = read_log(a.log)
    finite = lambda v: math.isfinite(v)
    tr = [(s, v) for s, v in sorted(train.items()) if finite(v)]
    va = [(s, v, b) for s, (v, b) in sorted(val.items()) if finite(v)]
    xs = [s for s, _ in tr] + [s for s, _, _ in va]
    ys = [v for _, v in tr] + [v for _, v, _ in va]
    if not xs:
        raise SystemExit(f"loss_curve_svg: '{a.log}' holds no finite loss")
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x1 = x0 + 1
    pad = (y1 - y0) * 0.05 or 0.5
    y0, y1 = y0 - pad, y1 + pad
    px = lambda x: LEFT + (x - x0) / (x1 - x0) * (W - LEFT - RIGHT)
    py = lambda y: TOP + (y1 - y) / (y1 - y0) * (H - TOP - BOTTOM)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>']
    for t in ticks(y0, y1):
        if y0 <= t <= y1:
            svg.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{py(t):.1f}" y2="{py(t):.1f}" '
                       'stroke="#eee"/>')
            svg.append(f'<text x="{LEFT - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    for t in ticks(x0, x1):
        if x0 <= t <= x1:
            svg.append(f'<text x="{px(t):.1f}" y="{H - BOTTOM + 16}" text-anchor="middle">'
                       f'{t:g}</text>')
    svg.append(f'<text x="{(W + LEFT) / 2}" y="{H - 10}" text-anchor="middle">step</text>')
    svg.append(f'<text x="16" y="{(H + TOP) / 2}" transform="rotate(-90 16 {(H + TOP) / 2})" '
               'text-anchor="middle">loss</text>')
    line = lambda pts, colour, width: (
        f'<polyline fill="none" stroke="{colour}" stroke-width="{width}" points="' +
        " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts) + '"/>')
    if tr:
        svg.append(line(tr, TRAIN, 1))
        if a.smooth > 1:
            svg.append(line(smoothed(tr, a.smooth), SMOOTH, 2))
    if va:
        svg.append(line([(s, v) for s, v, _ in va], VAL, 1.5))
        for s, v, best in va:
            svg.append(f'<circle cx="{px(s):.1f}" cy="{py(v):.1f}" r="3" fill="{VAL}"/>')
            if best:
                svg.append(f'<circle cx="{px(s):.1f}" cy="{py(v):.1f}" r="7" fill="none" '
                           f'stroke="{VAL}"/>')
    legend = [(TRAIN, "train loss")]
    if tr and a.smooth > 1:
        legend.append((SMOOTH, f"train loss, mean of {a.smooth} steps"))
    if va:
        legend.append((VAL, "val loss" + (" (ringed: saved by --save-best)"
                                          if any(b for _, _, b in va) else "")))
    x = LEFT
    for colour, text in legend:
        svg.append(f'<rect x="{x}" y="12" width="14" height="4" fill="{colour}"/>')
        svg.append(f'<text x="{x + 18}" y="18">{text}</text>')
        x += 30 + 7 * len(text)
    if a.title:
        svg.append(f'<text x="{W - RIGHT}" y="18" text-anchor="end">{a.title}</text>')
    svg.append("</svg>")
    try:
        with open(a.out, "w") as f:
            f.write("\n".join(svg) + "\n")
    except OSError as e:
        raise SystemExit(f"loss_curve_svg: cannot write '{a.out}': {e.strerror}")
    best = min(va, key=lambda p: p[1]) if va else None
    print(f"{a.out}: {len(tr)} train steps, {len(va)} evaluations"
          + (f", lowest val loss {best[1]:.3f} at step {best[0]}" if best else ""))


if __name__ == "__main__":
    main()
