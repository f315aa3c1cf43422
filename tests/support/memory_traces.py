"""Synthetic CUDA memory snapshots whose answers are known: the memory timeline's and the memory
section's tests build them with `Trace`."""

from cs336_systems.measure import memory_timeline as mt
from cs336_systems.paths import PACKAGE_DIR

PACKAGE = PACKAGE_DIR
MODEL = str(PACKAGE / "lm/model.py")
LOSS = str(PACKAGE / "lm/loss.py")
T0 = 1_700_000_000_000_000  # unix-epoch microseconds


def frames(*where):
    """Innermost first, as the snapshot lists them; a torch frame innermost, as in real stacks."""
    return [{"filename": "/venv/torch/nn/functional.py", "line": 10, "name": "linear"}] + [
        {"filename": f, "line": line, "name": name} for f, line, name in where]


class Trace:
    """A snapshot under construction: events one microsecond apart."""

    def __init__(self):
        self.events, self.t = [], T0
        self.next_addr = 1 << 20

    def alloc(self, size, frames=()):
        addr, self.next_addr = self.next_addr, self.next_addr + (1 << 30)
        self._add("alloc", addr, size, list(frames))
        return addr

    def free(self, addr, size):
        self._add("free_requested", addr, size, [])
        self._add("free_completed", addr, size, [])

    def _add(self, action, addr, size, frames):
        self.t += 1
        self.events.append({"action": action, "addr": addr, "size": size, "stream": 0,
                            "time_us": self.t, "frames": frames})

    def snapshot(self, live_before=()):
        """`live_before`: (address, requested size) of blocks allocated before the recording and
        still allocated at the snapshot."""
        blocks = [{"address": a, "size": mt.block_size(s), "requested_size": s,
                   "state": "active_allocated", "frames": []} for a, s in live_before]
        segments = [{"device": 0, "address": a, "total_size": 2 << 20, "stream": 0,
                     "blocks": [b]} for (a, _), b in zip(live_before, blocks)]
        return {"segments": segments, "device_traces": [self.events]}
