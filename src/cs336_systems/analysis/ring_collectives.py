"""Ring collectives simulated over n devices (§7, 2026), each device's bytes sent per step
counted, so that `parallelism`'s closed-form times can be checked against them.

Device i sends to device i+1 and receives from device i-1 (mod n). A simulation returns each
device's result and sent[t][i], the bytes device i sends in step t. Every link runs at once,
so a step lasts as long as its largest send: `simulated_time`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Sent = list[list[int]]


def simulated_time(sent: Sent, egress_bytes_per_s: float) -> float:
    """Seconds for the steps of `sent`: each step ends when its largest send has gone."""
    return sum(max(step) for step in sent) / egress_bytes_per_s


def simulate_reduce_scatter(chunks: list[list[np.ndarray]]) -> tuple[list[list[np.ndarray]], Sent]:
    """Ring reduce-scatter of chunks[i][c], device i's chunk c (n chunks per device). In step t
    device i sends its chunk (i-t) mod n; the receiver adds it to its own. After n-1 steps device
    i holds the sum over devices of chunk (i+1) mod n (its other chunks are partial sums)."""
    n = len(chunks)
    chunks = [[c.copy() for c in device] for device in chunks]
    sent = []
    for t in range(n - 1):
        outgoing = [chunks[i][(i - t) % n].copy() for i in range(n)]
        for i in range(n):
            chunks[i][(i - 1 - t) % n] += outgoing[i - 1]
        sent.append([o.nbytes for o in outgoing])
    return chunks, sent


def simulate_all_gather(chunks: list[list[np.ndarray]]) -> tuple[list[list[np.ndarray]], Sent]:
    """Ring all-gather where device i starts with the complete chunk (i+1) mod n (as a
    reduce-scatter leaves it). In step t device i sends chunk (i+1-t) mod n, the one it
    received last; the receiver stores it. After n-1 steps every device has every chunk."""
    n = len(chunks)
    chunks = [[c.copy() for c in device] for device in chunks]
    sent = []
    for t in range(n - 1):
        outgoing = [chunks[i][(i + 1 - t) % n].copy() for i in range(n)]
        for i in range(n):
            chunks[i][(i - t) % n] = outgoing[i - 1]
        sent.append([o.nbytes for o in outgoing])
    return chunks, sent


def simulate_ring_all_reduce(tensors: Sequence[np.ndarray]) -> tuple[list[np.ndarray], Sent]:
    """The ring all-reduce of one tensor per device: split each into n chunks, reduce-scatter,
    all-gather. 2(n-1) steps of size/n bytes per device."""
    n = len(tensors)
    reduced, sent_rs = simulate_reduce_scatter([np.array_split(t, n) for t in tensors])
    gathered, sent_ag = simulate_all_gather(reduced)
    return [np.concatenate(device) for device in gathered], sent_rs + sent_ag


def simulate_alternate_all_reduce(tensors: Sequence[np.ndarray]) -> tuple[list[np.ndarray], Sent]:
    """alternate_ring_all_reduce: in step t (1 to n-1) device i sends x[(i-t+1) mod n], which is
    its own tensor at t = 1 and the one it received in step t-1 after that; it receives
    x[(i-t) mod n] from device i-1 and adds it to its sum. n-1 steps of `size` bytes."""
    n = len(tensors)
    sums = [t.copy() for t in tensors]
    holding = [t.copy() for t in tensors]     # holding[i] = x[(i-t+1) mod n] before step t
    sent = []
    for _ in range(1, n):
        outgoing, holding = holding, [holding[i - 1] for i in range(n)]
        for i in range(n):
            sums[i] += holding[i]
        sent.append([o.nbytes for o in outgoing])
    return sums, sent
