"""The overview's chart: jobs settled per minute over the last hour, as SVG
built on the server (stacked bars by outcome; no script, no inline style)."""

from __future__ import annotations

from datetime import timedelta

from markupsafe import Markup

from ..jobs import THROUGHPUT_MINUTES, Outcome, Throughput

__all__ = ["COLOURS", "render"]

#: Each outcome's colour; every one has a contrast of at least 4.5:1 on white.
COLOURS = {
    Outcome.COMPLETED: "#1a7f37",
    Outcome.FAILED: "#c21d2b",
    Outcome.CANCELLED: "#5c6570",
    Outcome.OUTCOME_UNKNOWN: "#8a5300",
    Outcome.INTERRUPTED: "#7747c9",
}

_WIDTH = 720
_HEIGHT = 180
_LEFT = 44  # room for the scale
_BOTTOM = 22  # room for the time axis
_TOP = 8


def _scale_top(peak: int) -> int:
    """The first of 1, 2, 5, 10, 20, 50, ... that is at least ``peak``."""
    magnitude = 1
    while True:
        for step in (1, 2, 5):
            if step * magnitude >= peak:
                return step * magnitude
        magnitude *= 10


def render(throughput: Throughput, queue: str | None = None) -> Markup:
    """The SVG chart of ``throughput`` (of one ``queue``, or all added up)."""
    counts = throughput.per_minute(queue)
    totals = [sum(per_outcome[minute] for per_outcome in counts.values()) for minute in range(THROUGHPUT_MINUTES)]
    peak = max(totals, default=0)
    top = _scale_top(max(peak, 1))
    plot_width = _WIDTH - _LEFT - 4
    plot_height = _HEIGHT - _TOP - _BOTTOM
    bar = plot_width / THROUGHPUT_MINUTES
    hour = {outcome: sum(per_minute) for outcome, per_minute in counts.items()}
    summary = ", ".join(f"{hour[o]} {o.value}" for o in Outcome if o in hour) or "nothing settled"
    label = f"Jobs settled per minute over the last hour{'' if queue is None else f' in queue {queue}'}: {summary}"
    parts: list[Markup] = [
        Markup(
            '<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" '
            'width="{w}" height="{h}" role="img" aria-label="{label}">'
        ).format(w=_WIDTH, h=_HEIGHT, label=label),
        Markup("<title>{}</title>").format(label),
    ]
    # The scale: a base line, the top, the middle.
    for value in (0, top // 2 if top >= 2 else None, top):
        if value is None:
            continue
        y = _TOP + plot_height * (1 - value / top)
        parts.append(
            Markup(
                '<line x1="{x1}" x2="{x2}" y1="{y:.1f}" y2="{y:.1f}" stroke="#d0d7de" stroke-width="1"/>'
                '<text x="{tx}" y="{ty:.1f}" text-anchor="end" font-size="11" fill="#424a53">{v}</text>'
            ).format(x1=_LEFT, x2=_WIDTH - 4, y=y, tx=_LEFT - 6, ty=y + 4, v=value)
        )
    start = throughput.start
    for minute in range(THROUGHPUT_MINUTES):
        if not totals[minute]:
            continue
        x = _LEFT + minute * bar
        y = _TOP + plot_height
        begins = start + timedelta(minutes=minute)
        tip = ", ".join(f"{counts[o][minute]} {o.value}" for o in Outcome if o in counts and counts[o][minute])
        parts.append(Markup("<g><title>{} UTC: {}</title>").format(begins.strftime("%H:%M"), tip))
        for outcome in Outcome:
            if outcome not in counts or not counts[outcome][minute]:
                continue
            height = plot_height * counts[outcome][minute] / top
            y -= height
            parts.append(
                Markup('<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{fill}"/>').format(
                    x=x + 1, y=y, w=max(bar - 2, 1), h=height, fill=COLOURS[outcome]
                )
            )
        parts.append(Markup("</g>"))
    for minutes_ago, anchor in ((60, "start"), (45, "middle"), (30, "middle"), (15, "middle"), (0, "end")):
        x = _LEFT + plot_width * (1 - minutes_ago / THROUGHPUT_MINUTES)
        text = "now" if minutes_ago == 0 else f"\u2212{minutes_ago} min"
        parts.append(
            Markup('<text x="{x:.1f}" y="{y}" text-anchor="{a}" font-size="11" fill="#424a53">{t}</text>').format(
                x=x, y=_HEIGHT - 6, a=anchor, t=text
            )
        )
    parts.append(Markup("</svg>"))
    return Markup("").join(parts) + legend(hour)


def legend(hour: dict[Outcome, int]) -> Markup:
    """The chart's key: each outcome's colour and its count in the hour."""
    items = [
        Markup(
            '<li><svg width="12" height="12" aria-hidden="true"><rect width="12" height="12" fill="{}"/></svg> '
            "{} <strong>{}</strong></li>"
        ).format(COLOURS[o], o.value, hour.get(o, 0))
        for o in Outcome
    ]
    return (
        Markup('<ul class="legend" aria-label="settled in the last hour">') + Markup("").join(items) + Markup("</ul>")
    )
