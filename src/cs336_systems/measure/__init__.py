"""Measuring, once each: timing.py (the timing harness), memory.py (the allocator's peaks and a
CPU stand-in), profiling.py (torch.profiler traces and reading them back), memory_timeline.py
(a CUDA memory snapshot as a small timeline), saved_tensors.py (what autograd saves for
backward), collectives.py (collectives against compute in a trace), intervals.py, ceilings.py
(the device's matmul rate and copy bandwidth, measured in the job), job_clock.py (where a job's
wall time goes)."""
