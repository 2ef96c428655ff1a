"""Timelines of a simulation: Chrome/Perfetto trace JSON and a Gantt picture."""
from __future__ import annotations

import json

from ..artifacts import atomic_write_text, pyplot, save_figure


class Tracer:
    """Collects slices (SM, track, label, start s, end s) of the first `max_sms` SMs."""

    def __init__(self, max_sms: int = 4):
        self.max_sms = max_sms
        self.slices: list[tuple[int, str, str, float, float]] = []

    def slice(self, sm: int, track: str, label: str, start: float, end: float) -> None:
        if sm < self.max_sms and end > start:
            self.slices.append((sm, track, label, start, end))

    def chrome_events(self) -> list[dict]:
        """Complete events: a process per SM, a thread per unit or copy engine."""
        tracks = sorted({(sm, track) for sm, track, *_ in self.slices})
        tid = {key: i for i, key in enumerate(tracks)}
        events = [{"ph": "M", "name": "process_name", "pid": sm, "args": {"name": f"SM {sm}"}}
                  for sm in sorted({sm for sm, _ in tracks})]
        events += [{"ph": "M", "name": "thread_name", "pid": sm, "tid": tid[(sm, track)],
                    "args": {"name": track}} for sm, track in tracks]
        events += [{"ph": "X", "name": label, "pid": sm, "tid": tid[(sm, track)],
                    "ts": start * 1e6, "dur": (end - start) * 1e6}
                   for sm, track, label, start, end in self.slices]
        return events

    def write_chrome(self, path: str) -> None:
        atomic_write_text(path, json.dumps({"traceEvents": self.chrome_events(),
                                            "displayTimeUnit": "ns"}))

    def write_png(self, path: str, title: str = "") -> None:
        plt = pyplot()
        tracks = sorted({(sm, track) for sm, track, *_ in self.slices})
        row = {key: i for i, key in enumerate(tracks)}
        colors = {}
        palette = plt.get_cmap("tab10")
        fig, ax = plt.subplots(figsize=(12, 0.35 * len(tracks) + 1.5))
        for sm, track, label, start, end in self.slices:
            color = colors.setdefault(track, palette(len(colors) % 10))
            ax.barh(row[(sm, track)], (end - start) * 1e6, left=start * 1e6, height=0.8, color=color)
        ax.set_yticks(range(len(tracks)), [f"SM{sm} {track}" for sm, track in tracks], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("time (µs)")
        ax.set_title(title, fontsize=9)
        fig.tight_layout()
        save_figure(fig, path, dpi=120)
