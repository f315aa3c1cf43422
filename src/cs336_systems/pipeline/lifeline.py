"""A job ends with the Snakemake that started it.

Snakemake runs each job's script in a process of its own (through a shell); killed with
SIGKILL, Snakemake cannot pass anything on, and its jobs would run to the end and write records
nobody asked for any more. `watch(on_exit)` finds the nearest Snakemake among this process's
ancestors and calls `on_exit` from a daemon thread as soon as that process is gone. Linux only
(it reads /proc); elsewhere, or outside Snakemake, it watches nothing.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

POLL_S = 0.5


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time) of `pid` from /proc, or None where it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "
    return int(fields[1]), fields[19]


def _is_snakemake(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(Path(arg.decode(errors="replace")).name in ("snakemake", "snakemake.exe")
               for arg in argv[:3] if arg)


def snakemake_ancestor(pid: int | None = None) -> tuple[int, str] | None:
    """(pid, start time) of the nearest ancestor that runs Snakemake, or None."""
    current = os.getpid() if pid is None else pid
    for _ in range(64):
        stat = _stat(current)
        if stat is None:
            return None
        parent = stat[0]
        if parent <= 1:
            return None
        if _is_snakemake(parent):
            parent_stat = _stat(parent)
            return (parent, parent_stat[1]) if parent_stat else None
        current = parent
    return None


def alive(process: tuple[int, str]) -> bool:
    """Whether the process (pid, start time) still runs: the same pid with the same start time
    (a pid reused by another process does not count)."""
    stat = _stat(process[0])
    return stat is not None and stat[1] == process[1]


def watch(on_exit: Callable[[], None], poll_s: float = POLL_S) -> threading.Thread | None:
    """Call `on_exit()` once the Snakemake this process runs under is gone; the watching
    thread, or None where there is nothing to watch."""
    snakemake = snakemake_ancestor()
    if snakemake is None:
        return None

    def loop() -> None:
        while alive(snakemake):
            time.sleep(poll_s)
        on_exit()

    thread = threading.Thread(target=loop, name="snakemake-lifeline", daemon=True)
    thread.start()
    return thread
