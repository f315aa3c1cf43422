"""Synthetic CUDA profiler traces whose answers are known (FSDP's gather timing)."""

from cs336_systems.measure.collectives import FORWARD_RANGE, GATHER_RANGE


class Trace:
    """A CUDA trace built event by event: CPU ranges, kernel launches and their kernels."""

    def __init__(self):
        self.events, self.correlation = [], 0

    def span(self, name, ts, dur):
        self.events.append({"ph": "X", "cat": "user_annotation", "name": name, "ts": ts,
                            "dur": dur, "tid": 1})

    def kernel(self, name, launched, start, dur):
        self.correlation += 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                            "ts": launched, "dur": 1, "tid": 1,
                            "args": {"correlation": self.correlation}})
        self.events.append({"ph": "X", "cat": "kernel", "name": name, "ts": start, "dur": dur,
                            "args": {"correlation": self.correlation}})


def two_uses() -> Trace:
    """Use `a`: gathered at 0-10 us, the layer could start at 100 (its first kernel launched
    then): hidden. Use `b`: gather issued at 20, ran 120-300; compute ran until 200: the layer
    waited 100 us for it."""
    t = Trace()
    t.span(f"{GATHER_RANGE} a.weight", 0, 5)
    t.kernel("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 2, 0, 10)
    t.span(f"{GATHER_RANGE} b.weight", 20, 5)
    t.kernel("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 22, 120, 180)
    t.span(f"{FORWARD_RANGE} a", 100, 50)
    t.kernel("sm90_xmma_gemm_f32f32", 101, 105, 95)  # a's matmul: 105-200
    t.span(f"{FORWARD_RANGE} norm", 150, 5)  # a unit without sharded weights: not a row
    t.span(f"{FORWARD_RANGE} b", 160, 50)
    t.kernel("sm90_xmma_gemm_f32f32", 161, 300, 50)
    return t
