"""Which GPUs a job measures on, when Snakemake runs several jobs at once on a machine with
several GPUs.

Snakemake counts GPUs (`--resources gpu=N` bounds the sum of the running jobs' `gpu`
resources, which `measuring_job` in workflow/rules/common.smk declares) but does not say which
ones a job gets. So each job that asks for GPUs claims that many of the machine's free ones
before it starts and holds them until its process ends: one lock file per GPU (an `flock`, which
the kernel drops when the holder dies, however it dies), taken all at once under a lock of the
whole pool so that two jobs never each hold part of what the other waits for. The job then runs
with CUDA_VISIBLE_DEVICES naming its GPUs, so its `cuda:0`, and torchrun's ranks'
`cuda:<local rank>`, are its own. A job that finds too few free waits for them, so two timing
jobs never share a GPU whatever `--cores` says; with `--cores 1` jobs run one at a time and
always get the first GPUs.

    with placed(job_gpus):          # sets CUDA_VISIBLE_DEVICES and PLACEMENT_ENV, or nothing
        run the job

The pool is the GPUs CUDA_VISIBLE_DEVICES already names, else every GPU of the machine (counted
from the driver, without CUDA). A job asking for more GPUs than the pool has, or for none, is
left alone (a job that cannot run writes its own `skipped` record), and so is a job that SLURM
placed (profiles/slurm: it sees only the GPUs SLURM gave it). The locks live in
CS336_GPU_LOCKS (default: a folder of the temporary directory per user), one pool per machine
whichever checkout or preset the jobs come from.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

LOCKS_ENV = "CS336_GPU_LOCKS"
PLACEMENT_ENV = "CS336_GPU_PLACEMENT"   # the claim as JSON, for the record's env
POLL_S = 0.5


@dataclass(frozen=True)
class Placement:
    """A job's claim: its GPUs (as the pool names them), the pool's size, how many of the
    pool's GPUs were claimed when it started (its own included) and how long it waited."""

    gpus: tuple[str, ...]
    pool: int
    busy: int
    wait_s: float

    def to_json(self) -> str:
        return json.dumps({"gpus": list(self.gpus), "pool": self.pool, "busy": self.busy,
                           "wait_s": round(self.wait_s, 3)})


def machine_gpus() -> list[str]:
    """The GPUs jobs may claim: CUDA_VISIBLE_DEVICES's entries where it is set, else one index
    per GPU the NVIDIA driver lists (none on a machine without one)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip()]
    with suppress(OSError):
        return [str(i) for i in range(len(os.listdir("/proc/driver/nvidia/gpus")))]
    if not os.path.exists("/dev/nvidiactl"):
        return []
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(listed.splitlines()) if line.startswith("GPU ")]


def scheduler_placed() -> bool:
    """Whether a cluster scheduler gave this job its GPUs (SLURM's jobs see only theirs)."""
    return "SLURM_JOB_ID" in os.environ


def lock_dir() -> Path:
    path = Path(os.environ.get(LOCKS_ENV) or
                Path(tempfile.gettempdir()) / f"cs336-gpus-{os.getuid()}")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _try_lock(path: Path) -> int | None:
    """An open descriptor holding `path`'s exclusive lock, or None where another holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except BlockingIOError:
        os.close(fd)
        return None


def _gpu_lock(gpu: str) -> Path:
    return lock_dir() / f"gpu-{gpu}.lock"


def busy(pool: Sequence[str]) -> int:
    """How many of the pool's GPUs some process holds now."""
    held = 0
    for gpu in pool:
        fd = _try_lock(_gpu_lock(gpu))
        if fd is None:
            held += 1
        else:
            os.close(fd)
    return held


def claim(count: int, pool: Sequence[str], timeout_s: float | None = None
          ) -> tuple[Placement, list[int]]:
    """Wait until `count` of the pool's GPUs are free and take them: the placement and the
    descriptors that hold them (closing them frees the GPUs). Raises TimeoutError after
    `timeout_s` (None: wait as long as it takes)."""
    if not 0 < count <= len(pool):
        raise ValueError(f"cannot claim {count} of a pool of {len(pool)} GPUs")
    started = time.time()
    while True:
        with open(lock_dir() / "pool.lock", "w") as pool_lock:
            fcntl.flock(pool_lock, fcntl.LOCK_EX)
            held: list[tuple[str, int]] = []
            for gpu in pool:
                if (fd := _try_lock(_gpu_lock(gpu))) is not None:
                    held.append((gpu, fd))
                    if len(held) == count:
                        break
            if len(held) == count:
                gpus = tuple(gpu for gpu, _ in held)
                fds = [fd for _, fd in held]
                placement = Placement(gpus, len(pool), busy(pool), time.time() - started)
                return placement, fds
            for _, fd in held:
                os.close(fd)
        if timeout_s is not None and time.time() - started > timeout_s:
            raise TimeoutError(f"{count} of the GPUs {','.join(pool)} were not free within "
                               f"{timeout_s:g} s")
        time.sleep(POLL_S)


@contextmanager
def placed(count: int, pool: Sequence[str] | None = None) -> Iterator[Placement | None]:
    """Hold `count` free GPUs of the pool for the block, with CUDA_VISIBLE_DEVICES naming them
    and PLACEMENT_ENV describing the claim; None, and nothing set, where the job asks for no
    GPU, for more than the pool has, or under a scheduler that placed it already."""
    pool = machine_gpus() if pool is None else list(pool)
    if not 0 < count <= len(pool) or scheduler_placed():
        yield None
        return
    placement, fds = claim(count, pool)
    saved = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", PLACEMENT_ENV)}
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(placement.gpus)
    os.environ[PLACEMENT_ENV] = placement.to_json()
    try:
        yield placement
    finally:
        for fd in fds:
            os.close(fd)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def placement_of_this_job() -> dict | None:
    """The claim this process's job runs under (for its record's env), or None."""
    raw = os.environ.get(PLACEMENT_ENV)
    return json.loads(raw) if raw else None
