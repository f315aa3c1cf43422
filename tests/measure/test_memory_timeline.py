"""The active memory timeline: a snapshot reduced to stacked allocations, phases marked by time,
the bands' outlines, and the picture; on synthetic snapshots whose answers are known."""

import random
from pathlib import Path

import numpy as np
import pytest

from cs336_systems.measure import memory_timeline as mt
from cs336_systems.report import figures
from cs336_systems.sections.memory import timeline_figure as plot
from support.checkout import ROOT
from support.memory_traces import LOSS, MODEL, PACKAGE, T0, Trace, frames


@pytest.fixture
def step():
    """Before recording: weights 1000 bytes (still live) and a block of 300 that forward frees.
    Forward allocates a (100, lm/model.py:20), b (200, lm/model.py:30), c (400, lm/loss.py:5),
    frees a;
    backward allocates d (50, no frame), frees b, c, d: 9 events, peak 1000 + 100 + 200 + 400
    = 1700 at c's allocation, in forward (the block of 300 is gone by then)."""
    trace, marks = Trace(), []
    marks.append({"step": 1, "phase": "forward", "time_us": trace.t + 1})
    a = trace.alloc(100, frames((MODEL, 20, "forward")))
    b = trace.alloc(200, frames((MODEL, 30, "forward")))
    trace.free(5 << 40, 300)                                    # allocated before recording
    c = trace.alloc(400, frames((LOSS, 5, "cross_entropy"), (MODEL, 99, "x")))
    trace.free(a, 100)
    marks.append({"step": 1, "phase": "backward", "time_us": trace.t + 1})
    d = trace.alloc(50)
    for addr, size in ((b, 200), (c, 400), (d, 50)):
        trace.free(addr, size)
    return trace.snapshot(live_before=[(7 << 40, 1000)]), marks


def test_a_snapshot_reduces_to_stacked_allocations_with_their_sources(step):
    snapshot, marks = step
    tl = mt.reduce_snapshot(snapshot, 0, marks, PACKAGE)
    assert tl.events == 9 and tl.base_bytes == 1000 and tl.initial_bytes == 1300
    # the block freed without having been allocated lies lowest, then a, b, c, d
    assert tl.size.tolist() == [300, 100, 200, 400, 50]
    assert tl.start.tolist() == [-1, 0, 1, 3, 5]
    assert tl.end.tolist() == [2, 4, 6, 7, 8]
    labels = [tl.sites[s]["label"] for s in tl.site]
    assert labels == [mt.PREEXISTING, "lm/model.py:20", "lm/model.py:30", "lm/loss.py:5",
                      "no Python frame (backward)"]
    loss = tl.sites[tl.site[3]]
    assert loss["function"] == "cross_entropy" and loss["category"] == "lm/loss.py"
    assert loss["source"] and loss["source"] in Path(LOSS).read_text().splitlines()[4]
    assert [m["event"] for m in tl.marks] == [0, 5]
    assert tl.live_bytes().tolist() == [1400, 1600, 1300, 1700, 1600, 1650, 1450, 1050, 1000]
    peak = tl.peak()
    assert peak == {"bytes": 1700, "event": 3, "step": 1, "phase": "forward"}
    assert tl.by_category(tl.live_at(3)) == [
        {"category": mt.PREEXISTING, "bytes": 1000}, {"category": "lm/loss.py", "bytes": 400},
        {"category": "lm/model.py", "bytes": 300}]


def test_the_timeline_round_trips_through_its_sidecar(step, tmp_path):
    tl = mt.reduce_snapshot(step[0], 0, step[1], PACKAGE)
    back = mt.Timeline.load(tl.save(tmp_path / "x.timeline.json.gz"))
    assert back.to_json() == tl.to_json()
    assert back.peak() == tl.peak() and back.largest() == tl.largest()


def test_the_largest_allocations_group_by_line_and_size():
    trace = Trace()
    where = [(MODEL, 20, "forward"), (MODEL, 30, "forward"), (LOSS, 5, "loss")]
    sizes = []
    for i in range(40):
        size = 1000 if i < 4 else random.randint(1, 500)
        sizes.append(size)
        trace.alloc(size, frames(where[0] if i < 3 else where[1 + i % 2]))
    tl = mt.reduce_snapshot(trace.snapshot(), 0, [], PACKAGE)
    rows = tl.largest()
    # the top 10 % of 40 are the four of 1000 bytes: three from line 20, one from line 30 or 5
    assert [(r["bytes"], r["count"]) for r in rows] == [(1000, 3), (1000, 1)]
    assert rows[0]["label"] == "lm/model.py:20" and rows[0]["phases"] == []
    assert sorted(tl.size[tl.largest_indices()].tolist()) == [1000] * 4


def test_allocations_of_the_residual_size_are_counted_at_the_allocators_rounding():
    trace = Trace()
    for size in (4096, 4000, 4096, 3585, 3584, 8192):
        trace.alloc(size, frames((MODEL, 20, "f")))
    tl = mt.reduce_snapshot(trace.snapshot(), 0, [], PACKAGE)
    found = tl.same_size(4096)      # 4000 and 3585 round up to 4096 too; 3584 does not
    assert found["block_bytes"] == 4096 and found["count"] == 4
    assert found["lines"] == [{"label": "lm/model.py:20", "count": 4}]
    assert mt.block_size(1) == 512 and mt.block_size(513) == 1024


def test_marks_map_to_the_first_event_at_or_after_them():
    times = [100, 200, 300, 400]
    marks = [{"time_us": t} for t in (50, 90, 200, 250, 500)]
    # before the trace: only the latest is the phase in force at event 0; after it: none
    assert mt.mark_events(times, marks) == [None, 0, 1, 2, None]


def test_marks_on_another_clock_mark_nothing_and_warn(caplog):
    times = [100, 200, 300]
    marks = [{"time_us": t} for t in (T0, T0 + 100)]
    assert mt.mark_events(times, marks) == [None, None]
    assert "phases are not marked" in caplog.text
    assert mt.mark_events([100, None], [{"time_us": 150}]) == [None]


def test_mark_phases_notes_each_phase_start_by_step():
    ran, marks = [], []
    phases = mt.mark_phases([("forward", lambda: ran.append("f")),
                             ("backward", lambda: ran.append("b"))], marks)
    for _ in range(2):
        for _, fn in phases:
            fn()
    assert ran == ["f", "b", "f", "b"]
    assert [(m["step"], m["phase"]) for m in marks] == [(1, "forward"), (1, "backward"),
                                                        (2, "forward"), (2, "backward")]
    times = [m["time_us"] for m in marks]
    assert times == sorted(times) and abs(times[0] - mt.now_us()) < 10_000_000


def _random_timeline(rng, events_target=400):
    trace, live = Trace(), []
    before = [(9 << 40, 77), (10 << 40, 33), (11 << 40, 500)]
    frees_before = list(before[:2])
    for _ in range(events_target):
        if live and (rng.random() < 0.45 or len(live) > 40):
            addr, size = live.pop(rng.randrange(len(live)))
            trace.free(addr, size)
        elif frees_before and rng.random() < 0.02:
            trace.free(*frees_before.pop())
        else:
            size = rng.randint(1, 10_000)
            live.append((trace.alloc(size, frames((MODEL, rng.randint(1, 5), "f"))), size))
    return mt.reduce_snapshot(trace.snapshot(live_before=before[2:]), 0, [], PACKAGE)


def _brute_force_bottoms(tl):
    """Each allocation's bottom after every event, by restacking the live list event by event."""
    bottoms = np.full((len(tl.size), tl.events), -1, dtype=np.int64)
    for t in range(tl.events):
        offset = tl.base_bytes
        for k in range(len(tl.size)):
            if tl.start[k] <= t < tl.end[k]:
                bottoms[k, t] = offset
                offset += tl.size[k]
    return bottoms


def test_band_outlines_match_restacking_at_every_event():
    tl = _random_timeline(random.Random(7))
    expected = _brute_force_bottoms(tl)
    outlines = plot.band_bottoms(tl, range(len(tl.size)))
    for k, (x, bottom) in outlines.items():
        for t in range(max(tl.start[k], 0), min(tl.end[k], tl.events)):
            step = np.searchsorted(x, t, side="right") - 1
            assert bottom[step] == expected[k, t], (k, t)
    # the silhouette of the stack is the live bytes
    top = max(expected[k, -1] + tl.size[k] for k in range(len(tl.size)) if tl.end[k] == tl.events)
    assert top == tl.live_bytes()[-1]


def test_band_polygon_traces_the_steps():
    poly = plot.band_polygon(np.array([0, 3]), np.array([10, 4]), end=5, size=2)
    assert poly.tolist() == [[0, 10], [3, 10], [3, 4], [5, 4],
                             [5, 6], [3, 6], [3, 12], [0, 12]]


def test_drawing_twenty_thousand_events_is_fast(tmp_path, real_figures):
    import time

    tl = _random_timeline(random.Random(3), events_target=20_000)
    palette = plot.colours([tl])
    fig, axes = figures.subplots(1)
    start = time.perf_counter()
    plot.draw(axes[0][0], tl, palette, "random")
    figures.save(fig, tmp_path / "t.png")
    assert time.perf_counter() - start < 15
    assert (tmp_path / "t.png").stat().st_size > 10_000


def test_the_palette_colours_the_lines_with_the_most_large_bytes_first(step):
    tl = mt.reduce_snapshot(step[0], 0, step[1], PACKAGE)
    palette = plot.colours([tl, tl])
    assert list(palette) == ["lm/loss.py:5"]        # the top 10 % of four: one allocation
    assert palette["lm/loss.py:5"] == plot.PALETTE[0]


def test_the_y_axis_zooms_only_where_the_steps_add_little():
    assert plot.zoom_bottom(start=60.0, top=65.0) == 55.0     # 5 of 65 GiB: zoom
    assert plot.zoom_bottom(start=13.0, top=13.5) == 12.5
    assert plot.zoom_bottom(start=10.0, top=65.0) == 0.0      # the steps make most of it
    assert plot.zoom_bottom(start=0.0, top=0.0) == 0.0


def test_a_real_snapshot_reduces_to_its_phases_and_lines():
    """A snapshot that torch 2.11 wrote on an H200 for one training step of a tiny model
    (batch 4, context 32, vocabulary 10000; fp32), run from /work/main/src: its phases are
    marked from the record_function ranges it holds, the peak falls in backward, and the
    largest allocations are the logits' (4 x 32 x 10000 x 4 bytes), made by the LM head and
    the loss, and their gradients, which autograd's thread makes with no Python frame."""
    import gzip
    import pickle

    path = ROOT / "tests/data/tiny_train_snapshot.pickle.gz"
    with gzip.open(path) as f:
        snapshot = pickle.load(f)
    marks = [{"step": 1, "phase": a["name"], "time_us": a["time_us"]}
             for a in snapshot["external_annotations"]
             if a["stage"] == "START" and a["name"] in ("forward", "backward", "optimizer")]
    timeline = mt.reduce_snapshot(snapshot, 0, marks, "/work/main/src/cs336_systems")

    events = [m["event"] for m in timeline.marks]
    assert [m["phase"] for m in timeline.marks] == ["forward", "backward", "optimizer"]
    assert None not in events and events == sorted(events) and events[0] == 0
    peak = timeline.peak()
    assert peak["phase"] == "backward" and peak["bytes"] > timeline.base_bytes > 0
    assert timeline.live_bytes().min() >= 0
    logits = 4 * 32 * 10_000 * 4
    largest = timeline.largest()
    assert largest[0]["bytes"] == logits
    made = timeline.same_size(logits)
    lines = {line["label"]: line["count"] for line in made["lines"]}
    # recorded before the package's layout by role: the model was model.py, the loss loss.py
    assert lines["no Python frame (backward)"] >= 2 and any(k.startswith("model.py:") for k in lines)
    assert any(k.startswith("loss.py:") for k in lines)
