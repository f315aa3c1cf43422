"""A CUDA memory snapshot reduced to its active memory timeline: what the timeline picture and the
memory tables need, small enough to keep in git, so they can be redrawn without the snapshot
(tens of MB, kept out of git).

    torch.cuda.memory._record_memory_history(...)   # ...measured steps, phases marked...
    snapshot = torch.cuda.memory._snapshot()
    timeline = reduce_snapshot(snapshot, device_index, marks, package_dir)
    timeline.save("x.timeline.json.gz");  Timeline.load("x.timeline.json.gz").peak()

The snapshot's format (torch/cuda/_memory_viz.py reads the same): `device_traces[d]` is the
caching allocator's ring of events for device d, each {action, addr, size, stream, time_us,
frames: [{filename, line, name}, innermost first]}; `segments` is the memory it holds when the
snapshot is taken, with each block's address, requested size and state. Read as
pytorch.org/memory_viz's "Active Memory Timeline" reads it:

- an event is an `alloc` or a `free_completed` (when the bytes become free for reuse; right
  after its `free_requested` unless the block waits on another stream); x is its index;
- allocations lie stacked in the order they were made, each sliding down when one below it is
  freed; underneath lies what was allocated before the recording began: the blocks still
  allocated at the snapshot that the trace never allocated (the base: weights, optimizer
  state), then the blocks the trace frees without having allocated them;
- sizes are the requested bytes. The allocator rounds each block up to a multiple of 512 bytes
  and may hand out a somewhat larger cached block; `torch.cuda.max_memory_allocated` counts
  those, so it can exceed this timeline's peak.

Phases: the experiment notes when each phase of a step starts (`now_us`, unix-epoch
microseconds). The events' `time_us` are on the same clock: the allocator stamps events with a
cycle counter and converts them to unix time when the snapshot is taken. `mark_events` maps a
mark to the first event at or after it.

Where an allocation came from: its innermost frame inside this package (file:line, function and
the line's text, read with linecache where the measurement ran). Backward's allocations are made
by autograd's engine thread and carry no Python frame; they are labelled as such, with the phase
they fell in.
"""

from __future__ import annotations

import functools
import gzip
import json
import linecache
import logging
import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

log = logging.getLogger("cs336_systems")

FORMAT_VERSION = 1
BLOCK_ROUNDING = 512        # the caching allocator's smallest unit: every block is a multiple
PREEXISTING = "allocated before recording"
NO_FRAME = "no Python frame"
OTHER_PYTHON = "Python code outside this project"
LARGEST_FRACTION = 0.10     # "the largest allocations": the top 10 % by size
LARGEST_ROWS = 20           # at most this many (source line, size) rows
MARK_SLACK_US = 1_000_000   # a mark this long before the first event still matches the clocks


def now_us() -> int:
    """Unix-epoch microseconds: the clock of the snapshot's `time_us`."""
    return time.time_ns() // 1000


def mark_phases(phases: Sequence[tuple[str, Callable[[], object]]], marks: list[dict]
                ) -> list[tuple[str, Callable[[], object]]]:
    """The phases of a step, each noting its start in `marks` ({step, phase, time_us}; steps
    count from 1 at each start of the first phase) before it runs."""
    first = phases[0][0]

    def marked(name: str, fn: Callable[[], object]) -> Callable[[], object]:
        def run():
            step = sum(m["phase"] == first for m in marks) + (name == first)
            marks.append({"step": step, "phase": name, "time_us": now_us()})
            return fn()
        return run
    return [(name, marked(name, fn)) for name, fn in phases]


def mark_events(event_times_us: Sequence[float | None], marks: Sequence[dict]) -> list[int | None]:
    """Each mark's event: the first event at or after its time. A mark after the last event gets
    None; of the marks before the first event only the latest gets 0 (the phase in force when
    the trace begins; the others' events were lost or never made). If no mark falls inside the
    trace's time range, or up to `MARK_SLACK_US` before it (a phase's first allocation follows
    its mark closely), the two clocks do not match: every mark gets None, with a warning."""
    times = np.asarray([math.nan if t is None else t for t in event_times_us], dtype=float)
    if not len(marks):
        return []
    if not len(times) or np.isnan(times).any():
        log.warning("memory timeline: events without time_us; phases are not marked")
        return [None] * len(marks)
    at = [m["time_us"] for m in marks]
    if not any(times[0] - MARK_SLACK_US <= t <= times[-1] for t in at):
        log.warning("memory timeline: no phase mark falls inside the trace's time range "
                    "(%d to %d us); phases are not marked", times[0], times[-1])
        return [None] * len(marks)
    events: list[int | None] = []
    before = [i for i, t in enumerate(at) if t <= times[0]]
    for i, t in enumerate(at):
        index = int(np.searchsorted(times, t, side="left"))
        if index >= len(times) or (t <= times[0] and i != before[-1]):
            events.append(None)
        else:
            events.append(index)
    return events


def describe_frames(frames: Sequence[dict], package_dir: str | Path, phase: str) -> dict:
    """Where an allocation came from: its innermost frame inside `package_dir` (file relative to
    it, line, function, the line's text); else the innermost Python frame; else no frame, named
    with the phase it fell in. `label` names it in a legend, `category` groups it."""
    python = [f for f in frames if str(f.get("filename", "")).endswith(".py")]
    for frame in python:
        path, relative = _in_package(frame["filename"], str(package_dir))
        if relative is None:
            continue
        return {"label": f"{relative}:{frame['line']}", "category": relative,
                "file": relative, "line": int(frame["line"]), "function": frame["name"],
                "source": linecache.getline(path, int(frame["line"])).strip()}
    if python:
        frame = python[0]
        name = Path(frame["filename"]).name
        return {"label": f"{name}:{frame['line']} {frame['name']}", "category": OTHER_PYTHON,
                "file": frame["filename"], "line": int(frame["line"]),
                "function": frame["name"], "source": ""}
    label = f"{NO_FRAME} ({phase})" if phase else NO_FRAME
    return {"label": label, "category": label, "file": "", "line": None, "function": "",
            "source": ""}


@functools.lru_cache(maxsize=4096)
def _in_package(filename: str, package_dir: str) -> tuple[str, str | None]:
    """A frame's file, resolved, and its path inside the package (None outside it). Cached: a
    trace has tens of thousands of frames over a few dozen files."""
    path = Path(filename).resolve()
    try:
        return str(path), path.relative_to(Path(package_dir).resolve()).as_posix()
    except ValueError:
        return str(path), None


def phase_at(marks: Sequence[dict], event: int) -> dict:
    """The mark in force at `event`: {step, phase} of the latest mark at or before it, or {}
    where none is known."""
    marked = [m for m in marks if m.get("event") is not None and m["event"] <= event]
    if not marked:
        return {}
    last = max(marked, key=lambda m: m["event"])
    return {"step": last["step"], "phase": last["phase"]}


PREEXISTING_SITE = {"label": PREEXISTING, "category": PREEXISTING, "file": "", "line": None,
                    "function": "", "source": ""}


@dataclass
class Timeline:
    """Allocations in stack order (bottom first): `start` is the index of the event that
    allocated it (-1: before the trace), `end` the event that freed it (`events`: still live at
    the end), `size` its requested bytes, `site` an index into `sites`. `base_bytes` lie under
    all of them for the whole trace. `marks`: {step, phase, event} where each phase began
    (event None where unknown)."""

    events: int
    base_bytes: int
    start: np.ndarray
    end: np.ndarray
    size: np.ndarray
    site: np.ndarray
    sites: list[dict]
    marks: list[dict] = field(default_factory=list)

    # --- storage ------------------------------------------------------------------------------

    def to_json(self) -> dict:
        return {"version": FORMAT_VERSION, "events": self.events, "base_bytes": self.base_bytes,
                "start": self.start.tolist(), "end": self.end.tolist(),
                "size": self.size.tolist(), "site": self.site.tolist(), "sites": self.sites,
                "marks": self.marks}

    @classmethod
    def from_json(cls, data: dict) -> Timeline:
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(f"memory timeline format {data.get('version')!r}; this code reads "
                             f"version {FORMAT_VERSION}")
        arrays = {k: np.asarray(data[k], dtype=np.int64) for k in ("start", "end", "size", "site")}
        return cls(events=int(data["events"]), base_bytes=int(data["base_bytes"]),
                   sites=list(data["sites"]), marks=list(data["marks"]), **arrays)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt") as f:
            json.dump(self.to_json(), f, separators=(",", ":"))
        return path

    @classmethod
    def load(cls, path: str | Path) -> Timeline:
        with gzip.open(path, "rt") as f:
            return cls.from_json(json.load(f))

    # --- reading ------------------------------------------------------------------------------

    @property
    def initial_bytes(self) -> int:
        """Live bytes before the first event: everything allocated before the recording."""
        return self.base_bytes + int(self.size[self.start < 0].sum())

    def live_bytes(self) -> np.ndarray:
        """Live bytes after each event: (events,) int64."""
        delta = np.zeros(self.events + 1, dtype=np.int64)
        made = self.start >= 0
        np.add.at(delta, self.start[made], self.size[made])
        np.add.at(delta, self.end, -self.size)           # index `events`: never freed, unused
        return self.initial_bytes + np.cumsum(delta[:self.events])

    def live_at(self, event: int) -> np.ndarray:
        """Which allocations are live after `event` (-1: before the first): a boolean mask."""
        return (self.start <= event) & (self.end > event)

    def phase_at(self, event: int) -> dict:
        return phase_at(self.marks, event)

    def peak(self) -> dict:
        """The most live bytes: {bytes, event (-1: before the first), step, phase}."""
        live = self.live_bytes()
        if not len(live) or live.max() <= self.initial_bytes:
            return {"bytes": self.initial_bytes, "event": -1, **self.phase_at(-1)}
        event = int(np.argmax(live))
        return {"bytes": int(live[event]), "event": event, **self.phase_at(event)}

    def by_category(self, mask: np.ndarray) -> list[dict]:
        """Bytes of the allocations in `mask` by their sites' category, largest first; the base
        counts as allocated before recording."""
        totals: dict[str, int] = defaultdict(int)
        totals[PREEXISTING] += self.base_bytes
        for site, size in zip(self.site[mask], self.size[mask]):
            totals[self.sites[site]["category"]] += int(size)
        return [{"category": c, "bytes": b}
                for c, b in sorted(totals.items(), key=lambda kv: -kv[1]) if b]

    def made_in_trace(self) -> np.ndarray:
        return self.start >= 0

    def largest_indices(self, fraction: float = LARGEST_FRACTION) -> np.ndarray:
        """The largest allocations the trace made: the top `fraction` of them by size (at least
        one), as stack positions, largest first."""
        made = np.flatnonzero(self.made_in_trace())
        order = made[np.argsort(-self.size[made], kind="stable")]
        return order[:max(1, math.ceil(fraction * len(made)))] if len(made) else order

    def largest(self, fraction: float = LARGEST_FRACTION, rows: int = LARGEST_ROWS) -> list[dict]:
        """The largest allocations the trace made (`largest_indices`), grouped by (source line,
        size), largest first: bytes, how many, the phases they were made in, and where they
        came from."""
        groups: dict[tuple[int, int], list[int]] = defaultdict(list)
        for k in self.largest_indices(fraction):
            groups[(int(self.site[k]), int(self.size[k]))].append(int(k))
        out = []
        for (site, size), members in sorted(groups.items(), key=lambda kv: (-kv[0][1],
                                                                            -len(kv[1]))):
            phases = Counter(self.phase_at(int(self.start[k])).get("phase", "") for k in members)
            out.append({"bytes": size, "count": len(members),
                        "phases": [p for p, _ in phases.most_common() if p],
                        **self.sites[site]})
        return out[:rows]

    def same_size(self, nbytes: int) -> dict:
        """Allocations the trace made whose block, rounded as the allocator rounds, is as large as
        a block of `nbytes`: how many, and the source lines that made them (most first)."""
        rounded = block_size(nbytes)
        made = self.made_in_trace()
        hits = np.flatnonzero(made & (block_sizes(self.size) == rounded))
        lines = Counter(self.sites[int(self.site[k])]["label"] for k in hits)
        return {"bytes": nbytes, "block_bytes": rounded, "count": len(hits),
                "lines": [{"label": label, "count": n} for label, n in lines.most_common()]}


def block_size(nbytes: int) -> int:
    """The allocator's block for a request: at least 512 bytes, a multiple of 512."""
    return max(BLOCK_ROUNDING, -(-int(nbytes) // BLOCK_ROUNDING) * BLOCK_ROUNDING)


def block_sizes(sizes: np.ndarray) -> np.ndarray:
    return np.maximum(BLOCK_ROUNDING, -(-sizes // BLOCK_ROUNDING) * BLOCK_ROUNDING)


def reduce_snapshot(snapshot: dict, device: int, marks: Sequence[dict],
                    package_dir: str | Path) -> Timeline:
    """The active memory timeline of `device` in `snapshot`, its phases marked with `marks`
    ({step, phase, time_us}, from `mark_phases`)."""
    traces = snapshot.get("device_traces", [])
    trace = [e for e in (traces[device] if device < len(traces) else [])
             if e["action"] in ("alloc", "free_completed")]
    events = len(trace)
    marked = [{"step": m["step"], "phase": m["phase"], "event": e}
              for m, e in zip(marks, mark_events([e.get("time_us") for e in trace], marks))]

    sites: dict[str, int] = {}
    site_list: list[dict] = []

    def site_index(site: dict) -> int:
        if site["label"] not in sites:
            sites[site["label"]] = len(site_list)
            site_list.append(site)
        return sites[site["label"]]

    made: list[list[int]] = []            # [start, end, size, site] in the order of allocation
    before: list[list[int]] = []          # freed here, allocated before the recording
    live: dict[int, int] = {}             # address -> index into `made`
    for index, e in enumerate(trace):
        if e["action"] == "alloc":
            where = describe_frames(e.get("frames") or [], package_dir,
                                    phase_at(marked, index).get("phase", ""))
            live[e["addr"]] = len(made)
            made.append([index, events, int(e["size"]), site_index(where)])
        elif e["addr"] in live:
            made[live.pop(e["addr"])][1] = index
        else:
            before.append([-1, index, int(e["size"]), site_index(PREEXISTING_SITE)])
    live_addresses = set(live)
    segments = [s for s in snapshot.get("segments", []) if s.get("device", device) == device]
    base = sum(int(b.get("requested_size", b["size"]))
               for segment in segments for b in _blocks(segment)
               if b["state"] == "active_allocated" and b["address"] not in live_addresses)
    # bottom first: those freed latest lie lowest, so fewer bands slide
    rows = sorted(before, key=lambda r: -r[1]) + made
    columns = np.asarray(rows, dtype=np.int64).reshape(-1, 4).T
    return Timeline(events=events, base_bytes=base, start=columns[0], end=columns[1],
                    size=columns[2], site=columns[3], sites=site_list, marks=marked)


def _blocks(segment: dict):
    """A segment's blocks, each with its address (older snapshots leave it to be summed)."""
    address = segment["address"]
    for block in segment.get("blocks", []):
        yield {**block, "address": block.get("address", address)}
        address += block["size"]
