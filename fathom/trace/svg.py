"""A trace drawn as SVG: the path hop by hop, top to bottom (`render(result)`, a trace as
fathom.trace.trace returns it).

Each hop is a box (the switch, the port it came in on, the tables it was traced in: desired or
actual), with the stages that did something to the packet as chips in the order met (red: where it
was dropped; amber: where the switch's actual flow is not the desired one), the ports it left by
(and the tunnel), and the time the hop took when the trace has one. A hop hangs under the hop it
came from. What became of each branch follows its hop; then the verdict and, for a live trace, the
probe's sightings with their kernel times and the time between them.

Every text (port, network, rule names: tenants choose them) is escaped; nothing of the trace
goes into an attribute. Plain text, no dependency: any browser or the web console shows it.
"""
from __future__ import annotations

from xml.sax.saxutils import escape

from fathom.trace.walk import passed_through

WIDTH = 960
PAD, LINE, CHIP_H, INDENT = 12, 16, 20, 28
CHAR = 6.6                     # px per character of the 12 px font, to wrap chips and clip lines
COLOURS = {"delivered": "#d8f0d8", "dropped": "#f6d5d5", "unknown": "#eeeeee", "uplink": "#dde8f6",
           "controller": "#eeeeee"}
CHIP, CHIP_DROP, CHIP_DIFF = "#e4ecf7", "#f3b6b6", "#f5deaa"


def _text(x: float, y: float, s: str, size: int = 12, weight: str = "normal", width: float | None = None) -> str:
    if width is not None and len(s) * CHAR > width:
        s = s[:max(1, int(width / CHAR) - 1)] + "…"
    return f'<text x="{x:.0f}" y="{y:.0f}" font-size="{size}" font-weight="{weight}">{escape(s)}</text>'


def render(result: dict) -> str:
    out: list[str] = []
    y = PAD
    to = result["to"]
    src = result["source"]
    head = f"{src['port']} ({src['ip']}) → {to['ip']}" + (f" ({to['port']})" if to.get("port") else "")
    out.append(_text(PAD, y + 14, head, 15, "bold", WIDTH - 2 * PAD))
    y += 22
    out.append(_text(PAD, y + 12, f"tables: {result['assumptions']['state']}; ct_state assumed "
                                  f"{result['assumptions']['ct_state']}", width=WIDTH - 2 * PAD))
    y += 24
    depth: dict[int, int] = {}
    anchor: dict[int, tuple[float, float]] = {}     # hop id -> (x, bottom y) its children hang from
    for hop in result["hops"]:
        d = depth[hop["id"]] = 0 if hop["from"] is None else depth.get(hop["from"], 0) + 1
        x = PAD + d * INDENT
        w = WIDTH - PAD - x
        box, y_end = _hop(hop, result["leaves"], x, y, w)
        if hop["from"] in anchor:
            px, py = anchor[hop["from"]]
            out.append(f'<path d="M{px:.0f},{py:.0f} V{y + 14:.0f} H{x:.0f}" fill="none" stroke="#667" '
                       f'marker-end="url(#arrow)"/>')
        out += box
        anchor[hop["id"]] = (x + INDENT / 2, y_end)
        y = y_end + 10
    v = result["verdict"]
    text = f"verdict: {v['result']}" + (f" to {v['port']} on {v['node']}" if v.get("port") else "") + f" — {v['reason']}"
    lines = _wrap(text, WIDTH - 4 * PAD)
    out.append(f'<rect x="{PAD}" y="{y}" width="{WIDTH - 2 * PAD}" height="{len(lines) * LINE + 10}" rx="6" '
               f'fill="{COLOURS.get(v["result"], "#eeeeee")}" stroke="#555"/>')
    for i, line in enumerate(lines):
        out.append(_text(2 * PAD, y + 17 + i * LINE, line, weight="bold" if i == 0 else "normal"))
    y += len(lines) * LINE + 10 + PAD
    if result.get("live"):
        y = _live(out, result["live"], y)
    diff = result.get("difference")
    if diff:
        for line in _wrap(f"desired: {diff['desired']}, actual: {diff['actual']} — {diff.get('reason', '')}",
                          WIDTH - 2 * PAD):
            out.append(_text(PAD, y + 12, line))
            y += LINE
        y += PAD
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{y:.0f}" '
            f'viewBox="0 0 {WIDTH} {y:.0f}" font-family="sans-serif">\n'
            '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
            'orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#667"/></marker></defs>\n'
            f'<rect width="{WIDTH}" height="{y:.0f}" fill="#ffffff"/>\n' + "\n".join(out) + "\n</svg>\n")


def _live(out: list[str], live: dict, y: float) -> float:
    """The probe's sightings in time order and the time between them."""
    out.append(_text(PAD, y + 12, "live probe, kernel times (µs after injection) and between sightings:", weight="bold"))
    y += LINE + 4
    for p in live["points"]:
        out.append(_text(2 * PAD, y + 12, f"+{p['at_us']:.1f} µs  {p['dev']} {p['dir']} on {p['node']} ({p['packet']})",
                         width=WIDTH - 3 * PAD))
        y += LINE
    for seg in live["segments"]:
        out.append(_text(2 * PAD, y + 12, f"{seg['us']:.1f} µs  {seg['where']} ({seg['packet']})", width=WIDTH - 3 * PAD))
        y += LINE
    return y + PAD


def _hop(hop: dict, leaves: list[dict], x: float, y: float, w: float) -> tuple[list[str], float]:
    """The hop's box and what is inside it; and the y where it ends."""
    inner: list[str] = []
    cy = y + 18
    title = f"#{hop['id']} {hop['switch']} (in {hop['in_port']})"
    if hop.get("tables"):
        title += f" — tables: {hop['tables']}"
    if hop.get("time_us") is not None:
        title += f" — {hop['time_us']} µs"
    inner.append(_text(x + 8, cy, title, weight="bold", width=w - 16))
    cy += 8
    mine = [lf for lf in leaves if lf["hop"] == hop["id"]]
    dropped_at = {lf.get("step") for lf in mine if lf["result"] == "dropped"}
    differs = {d["stage"] for d in hop.get("differs", ())}
    cx = x + 8
    chips = [(i, s) for i, s in enumerate(hop["steps"]) if not passed_through(s) or i in dropped_at]
    if chips:
        for i, s in chips:
            label = s["stage"]
            cw = len(label) * CHAR + 12
            if cx + cw > x + w - 8:
                cx, cy = x + 8, cy + CHIP_H + 4
            fill = CHIP_DROP if i in dropped_at else CHIP_DIFF if s["stage"] in differs else CHIP
            inner.append(f'<rect x="{cx:.0f}" y="{cy:.0f}" width="{cw:.0f}" height="{CHIP_H}" rx="4" fill="{fill}" '
                         f'stroke="#889"/>')
            inner.append(_text(cx + 6, cy + 14, label))
            cx += cw + 4
        cy += CHIP_H + 4
    texts = []
    for o in hop["outputs"]:
        t = o.get("tunnel")
        texts.append(f"→ out {o['port']}" + (f" (VNI {t['vni']} to {t['to']} {t['remote_ip']})" if t else ""))
    for d in hop.get("differs", ()):
        texts.append(f"≠ {d['stage']}: desired {d['desired']}; actual {d['actual']}")
    for lf in mine:
        texts.append(f"{lf['result']}: {lf['detail']}")
    for t in texts:
        for line in _wrap(t, w - 16):
            cy += LINE
            inner.append(_text(x + 8, cy, line))
    cy += 8
    fill = "#fbfbfd" if hop.get("tables") != "unknown" else "#eeeeee"
    box = [f'<rect x="{x:.0f}" y="{y:.0f}" width="{w:.0f}" height="{cy - y:.0f}" rx="6" fill="{fill}" '
           f'stroke="#556"/>', *inner]
    return box, cy


def _wrap(text: str, width: float) -> list[str]:
    per = max(10, int(width / CHAR))
    lines, line = [], ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(word) > per:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
        while len(line) > per:
            lines.append(line[:per])
            line = line[per:]
    return lines + ([line] if line else [])
