"""The job server: a warm process that has imported torch and the other heavy libraries, and
forks a fresh child for each job.

On an H100 box `import torch` alone takes about 4 s, most of what a short job costs beyond its
measurement. Every job still runs in a process of its own, a child forked from the server: one
configuration's crash or out-of-memory stays its own, CUDA starts fresh in each child (the
server never touches it), and the child runs the code of the checkout as it is now, since the
server is keyed by the package's source files (paths, sizes, modification times), the Python
and the environment: an edit, another checkout or another environment gets a server of its own,
and a server nobody asks for exits after `IDLE_S`.

    status = submit(job)      # the job's exit status, or None: no server to be had, run it here

The client (the job's own process, which never imports torch) sends the job, its working
folder, environment and job-clock marks, and its stdout and stderr as file descriptors; the
child answers with its pid, runs `jobs.run_here(job)` and answers with its exit status. A
signal the client gets (Snakemake cancelling the job) goes on to the child's process group; if
Snakemake is killed outright, the client sees it go (`pipeline.lifeline`) and ends the child; if
the client dies, the child sees its connection close and ends too. Set CS336_JOBSERVER=0 to run
every job in its own fresh interpreter instead.

A server's socket, lock and log lie in this user's runtime folder (`runtime_dir`: under
$XDG_RUNTIME_DIR, else a private folder in the temp folder), and a server removes all three
when it exits idle; a server that fails to start leaves its log for the client to name.

    python -m cs336_systems.pipeline.jobserver --socket PATH [--idle-s 30]   (started by submit)
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib
import json
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

from cs336_systems.measure import job_clock
from cs336_systems.paths import PACKAGE_DIR, SRC_ROOT
from cs336_systems.pipeline import gpus, lifeline
from cs336_systems.pipeline.jobs import Job, run_here

IDLE_S = 30.0                 # a server with no job for this long exits
START_TIMEOUT_S = 180.0       # how long a client waits for a new server to listen
# What the server imports before it forks: what most jobs import, CUDA left alone. On a machine
# with an NVIDIA driver also Triton and Inductor (the kernels' and torch.compile's), which a
# CPU run imports only after setting TRITON_INTERPRET.
PRELOAD = ("torch", "numpy", "pandas", "matplotlib", "jinja2", "yaml", "einops")
PRELOAD_GPU = ("triton", "torch._inductor")
# Variables that differ between the processes of one run without changing what imports do:
# among them the GPUs a job was placed on (pipeline.gpus), which CUDA reads only when the
# child initialises it. (Keyed on them, jobs side by side on four GPUs started a server per
# placement, and a quarter of an assignment run's job time went to importing torch again.)
VOLATILE_ENV = ("_", "PWD", "OLDPWD", "SHLVL", "CUDA_VISIBLE_DEVICES", gpus.PLACEMENT_ENV)


def enabled() -> bool:
    return os.environ.get("CS336_JOBSERVER", "1") != "0"


def server_key() -> str:
    """What a server must share with its clients: the Python, the environment it imported
    under, and the package's source files."""
    digest = hashlib.sha256()
    env = {k: v for k, v in os.environ.items()
           if k not in VOLATILE_ENV and not k.startswith("SNAKEMAKE")}
    digest.update(json.dumps([sys.executable, sys.version, sorted(env.items())]).encode())
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        stat = path.stat()
        digest.update(f"{path}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:20]


def runtime_dir() -> Path | None:
    """This user's folder for job servers' sockets, locks and logs: $XDG_RUNTIME_DIR/cs336-jobs
    where that is set, else <temp>/cs336-jobs-<uid>, private to the user; None where such a
    folder cannot be had (another user owns the name), and then no server is used."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and os.path.isdir(base) and os.access(base, os.W_OK):
        folder = Path(base) / "cs336-jobs"
    else:
        folder = Path(tempfile.gettempdir()) / f"cs336-jobs-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        info = folder.lstat()
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        return None
    return folder


def socket_path(key: str, folder: Path) -> Path:
    return folder / f"{key}.sock"


@contextlib.contextmanager
def _locked(lock_path: Path):
    """Hold the lock file at `lock_path` (made if missing). A lock file that a server removed
    while this process waited for it is not the lock any more: take the new one."""
    while True:
        with open(lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                current = os.stat(lock_path).st_ino == os.fstat(lock.fileno()).st_ino
            except FileNotFoundError:
                current = False
            if current:
                yield
                return


def _remove_traces(path: Path) -> None:
    """A server that exits idle removes its lock and log (its socket is gone already), under
    the lock, so that no client is starting a server through them meanwhile."""
    lock_path = Path(f"{path}.lock")
    if not lock_path.exists():
        return
    with _locked(lock_path):
        Path(f"{path}.log").unlink(missing_ok=True)
        lock_path.unlink(missing_ok=True)


# --- frames: a 4-byte length, then JSON -------------------------------------------------------

def _send(conn: socket.socket, payload: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(payload).encode()
    frame = struct.pack("!I", len(data)) + data
    if fds:
        socket.send_fds(conn, [frame], fds)
    else:
        conn.sendall(frame)


def _receive(conn: socket.socket, with_fds: int = 0) -> tuple[dict | None, list[int]]:
    """One frame (None at a closed connection) and the descriptors sent with it."""
    fds: list[int] = []
    if with_fds:
        head, fds, _, _ = socket.recv_fds(conn, 4, with_fds)
    else:
        head = conn.recv(4)
    while head and len(head) < 4:
        more = conn.recv(4 - len(head))
        if not more:
            return None, fds
        head += more
    if len(head) < 4:
        return None, fds
    (size,) = struct.unpack("!I", head)
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            return None, fds
        data += chunk
    return json.loads(data), fds


# --- the client -------------------------------------------------------------------------------

def run(job: Job) -> int:
    """Run `job` on GPUs of its own (`pipeline.gpus`, where it asks for some) through the job
    server, or here when there is none; its exit status."""
    with gpus.placed(job.gpus):
        job_clock.mark("placed")
        status = submit(job)
        if status is None:  # no server: the job runs here, and ends with Snakemake
            lifeline.watch(lambda: os.kill(os.getpid(), signal.SIGTERM))
            return run_here(job)
        return status


def submit(job: Job) -> int | None:
    """Run `job` in a child of this environment's server, starting the server
    if there is none; the child's exit status, or None when no server can be had."""
    if not enabled() or (folder := runtime_dir()) is None:
        return None
    path = socket_path(server_key(), folder)
    conn = _connect(path) or _start_and_connect(path)
    if conn is None:
        return None
    with conn:
        _send(conn, {"job": job.to_dict(), "cwd": os.getcwd(), "env": dict(os.environ),
                     "marks": job_clock.marks()}, fds=[1, 2])
        hello, _ = _receive(conn)
        if hello is None:
            print(f"job server at {path}: the child ended before it began", file=sys.stderr)
            return 1
        child = hello["pid"]
        lifeline.watch(lambda: _end_orphaned_job(child))
        forward = lambda signum, _frame: _kill_group(child, signum)  # noqa: E731
        previous = {s: signal.signal(s, forward)
                    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            result, _ = _receive(conn)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
    if result is None:
        print(f"job server: the job's process {child} ended without a status (killed or "
              "crashed)", file=sys.stderr)
        return 1
    return result["status"]


def _end_orphaned_job(child: int) -> None:
    """Snakemake is gone: end the job's process group, and this client with it."""
    print("job server client: Snakemake has exited; ending the job", file=sys.stderr,
          flush=True)
    _kill_group(child, signal.SIGTERM)
    os._exit(1)


def _kill_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        pass


def _connect(path: Path) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
        return conn
    except OSError:
        conn.close()
        return None


def _start_and_connect(path: Path) -> socket.socket | None:
    """Start a server for `path` (one at a time, under a lock) and connect to it."""
    with _locked(Path(f"{path}.lock")):
        conn = _connect(path)  # another job may have started it meanwhile
        if conn is not None:
            return conn
        path.unlink(missing_ok=True)  # a socket left by a server that died
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(SRC_ROOT), os.environ.get("PYTHONPATH")) if p)}
        with open(f"{path}.log", "a") as log:
            server = subprocess.Popen(
                [sys.executable, "-m", __name__, "--socket", str(path), "--idle-s", str(IDLE_S)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, cwd="/",
                start_new_session=True)
        deadline = time.time() + START_TIMEOUT_S
        while time.time() < deadline:
            conn = _connect(path)
            if conn is not None:
                return conn
            if server.poll() is not None:
                print(f"job server for {path} exited with {server.returncode} before it "
                      f"listened (its log: {path}.log); running the job here", file=sys.stderr)
                return None
            time.sleep(0.05)
        print(f"job server for {path} did not listen within {START_TIMEOUT_S:.0f} s; "
              "running the job here", file=sys.stderr)
        return None


# --- the server and its children ---------------------------------------------------------------

def preload() -> list[str]:
    """Import what the jobs will import, leaving CUDA alone; the modules imported."""
    names = list(PRELOAD) + (list(PRELOAD_GPU) if os.path.exists("/dev/nvidiactl") else [])
    loaded = []
    for name in names:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except ImportError:
            pass
    if "matplotlib" in loaded:
        import matplotlib
        matplotlib.use("Agg")
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise RuntimeError("importing the preloaded modules initialised CUDA: a forked child "
                           "could not use it")
    return loaded


def serve(path: Path, idle_s: float) -> None:
    started = time.time()
    loaded = preload()
    print(f"{time.strftime('%H:%M:%S')} job server {os.getpid()}: imported "
          f"{', '.join(loaded)} in {time.time() - started:.1f} s; listening on {path}",
          flush=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(64)
    listener.settimeout(0.5)
    children: set[int] = set()
    last = time.time()
    idle = False
    try:
        while True:
            children -= {pid for pid in list(children) if _reaped(pid)}
            if not children and time.time() - last > idle_s:
                idle = True
                break
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            last = time.time()
            sys.stdout.flush()
            sys.stderr.flush()
            with warnings.catch_warnings():
                # The server's only other threads are the idle pools of the BLAS libraries it
                # imported, which hold no lock between calls and reinitialise in a child (as
                # PyTorch's DataLoader workers forked from a parent that imported torch do).
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:
                listener.close()
                _child(conn)  # never returns
            children.add(pid)
            conn.close()
    finally:
        listener.close()
        path.unlink(missing_ok=True)
    print(f"{time.strftime('%H:%M:%S')} job server {os.getpid()}: idle for {idle_s:g} s, "
          "exiting", flush=True)
    if idle:
        _remove_traces(path)


def _reaped(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done == pid


def _child(conn: socket.socket) -> None:
    """One job, in a forked child of the server: take over the client's stdout and stderr,
    folder and environment, run the job, answer with its status, exit."""
    status, finished = 1, threading.Event()
    try:
        os.setsid()  # its own process group, which the client's signals go to
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_DFL)
        request, fds = _receive(conn, with_fds=2)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in fds:
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        job_clock.restore(request["marks"])
        job_clock.mark("forked")
        _send(conn, {"pid": os.getpid()})
        threading.Thread(target=_end_with_client, args=(conn, finished), daemon=True).start()
        status = run_here(Job.from_dict(request["job"]))
    except BaseException:  # noqa: BLE001 - the client must hear of every failure
        import traceback
        traceback.print_exc()
    finally:
        finished.set()
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            _send(conn, {"status": status})
        except OSError:
            pass
        os._exit(status)


def _end_with_client(conn: socket.socket, finished: threading.Event) -> None:
    """End this job's process group when its client goes away before the job has finished
    (the client killed, say)."""
    try:
        while conn.recv(1):
            pass
    except OSError:
        pass
    if finished.is_set():
        return
    _kill_group(os.getpid(), signal.SIGTERM)
    time.sleep(10)
    _kill_group(os.getpid(), signal.SIGKILL)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--socket", required=True, type=Path)
    parser.add_argument("--idle-s", type=float, default=IDLE_S)
    args = parser.parse_args(argv)
    serve(args.socket, args.idle_s)


if __name__ == "__main__":
    main()
