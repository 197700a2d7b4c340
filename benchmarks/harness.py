"""Shared pieces of the benchmarks: isolated dirs, a real Jupyter kernel, horovodrun, statistics.

Importing this module points IPython and Jupyter at fresh temp folders (before
anything reads them), so a benchmark never touches the user's profiles, and
drops thread variables inherited from the caller (each run sets its own).

* :class:`Kernel` -- an IPython kernel started with ``jupyter_client`` (what a
  notebook front end talks to), with helpers to run a cell and read values back.
* :func:`horovodrun` -- ``horovodrun -np 2 --gloo -H localhost:2 --network-interface lo``
  on ``hvd_train.py`` (through ``horovodrun_lo.py``: rendezvous on 127.0.0.1).
* :func:`tf_workers` -- TensorFlow's own multi-worker launch (``mwms_train.py``, ``TF_CONFIG``).
* :class:`Listeners` -- every listening socket of a process tree, sampled while a
  run is in progress; anything not on loopback is reported.
* Processes are ended by pid only: the kernel's and cluster's pids, horovodrun's
  own process group.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PY = sys.executable
sys.path.insert(0, str(BENCH))

import workload  # noqa: E402

sys.path.insert(0, str(ROOT / "tests"))
from kernel_driver import isolated_env  # noqa: E402  (the tests' isolation, shared)

HOME = Path(tempfile.mkdtemp(prefix="kdist-bench-"))
for _var in workload.THREAD_VARS:
    os.environ.pop(_var, None)
isolated_env(
    HOME,
    env=os.environ,
    TF_CPP_MIN_LOG_LEVEL="2",
    KERAS_BACKEND="tensorflow",
    PYTHONHASHSEED="0",
    PYTHONWARNINGS="ignore",
)
LOOPBACK = ("127.0.0.1", "::1")


def log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


def in_turn(variants, repeats: int):
    """``(repeat, variant)`` pairs, each repeat's order rotated by one (AB BA AB ..., ABC BCA CAB
    ...): no variant always runs first, so drift across a benchmark (caches, the page cache,
    other load) falls on every variant alike."""
    variants = list(variants)
    for i in range(repeats):
        k = i % len(variants)
        for v in variants[k:] + variants[:k]:
            yield i, v


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def read_ranks(out_dir: str | Path, tag: str, size: int = 2) -> list[dict]:
    """The timing records ``workload.train`` wrote for ``tag``, rank order."""
    out = []
    for rank in range(size):
        path = Path(out_dir) / f"{tag}-rank{rank}.json"
        if not path.exists():
            raise RuntimeError(f"{path} was not written: the run failed (see the log above)")
        out.append(json.loads(path.read_text()))
    return out


# -- sockets ---------------------------------------------------------------------------
class Listeners:
    """Samples the listening TCP sockets of ``pid`` and its descendants every ``every`` s."""

    def __init__(self, pid: int, every: float = 2.0):
        self.pid, self.every = pid, every
        self.seen: set[tuple[str, int, str]] = set()
        #: pid -> [name, CPU seconds at the first sample, at the latest sample]
        self.cpu: dict[int, list] = {}
        #: pid -> [(time.time(), CPU seconds), ...] every sample
        self.series: dict[int, list[tuple[float, float]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=10)

    def sample(self) -> None:
        import psutil

        from kdist_magics.cluster.compat_psutil import net_connections

        try:
            root = psutil.Process(self.pid)
            procs = [root] + root.children(recursive=True)
        except psutil.Error:
            return
        for proc in procs:
            try:
                conns = net_connections(proc, "tcp")
                name = " ".join(proc.cmdline()[:3])
                times = proc.cpu_times()
            except psutil.Error:
                continue
            used = times.user + times.system
            self.cpu.setdefault(proc.pid, [name, used, used])[2] = used
            self.series.setdefault(proc.pid, []).append((time.time(), used))
            for c in conns:
                if c.status == psutil.CONN_LISTEN:
                    self.seen.add((c.laddr.ip, c.laddr.port, name))

    def _loop(self) -> None:
        self.sample()
        while not self._stop.wait(self.every):
            self.sample()

    def cpu_seconds(self, exclude: set[int] = frozenset()) -> dict[str, float]:
        """CPU seconds each process used between the first and last sample, by name."""
        out: dict[str, float] = {}
        for pid, (name, first, last) in self.cpu.items():
            if pid not in exclude:
                out[f"{name} [{pid}]"] = round(last - first, 3)
        return out

    def cpu_between(self, t0: float, t1: float, exclude: set[int] = frozenset()) -> float:
        """CPU seconds all sampled processes but ``exclude`` used from ``t0`` to ``t1``
        (interpolated between samples; a process first seen later counts from then)."""
        return sum(self.cpu_between_by_process(t0, t1, exclude).values())

    def cpu_between_by_process(self, t0: float, t1: float, exclude: set[int] = frozenset()) -> dict[str, float]:
        out: dict[str, float] = {}
        for pid, points in self.series.items():
            if pid in exclude or len(points) < 2:
                continue
            name = f"{self.cpu[pid][0]} [{pid}]"
            out[name] = max(0.0, _interp(points, t1) - _interp(points, t0))
        return out

    @property
    def exposed(self) -> list[str]:
        return sorted(f"{ip}:{port} ({name})" for ip, port, name in self.seen if ip not in LOOPBACK)


def _interp(points: list[tuple[float, float]], t: float) -> float:
    if t <= points[0][0]:
        return points[0][1]
    for (ta, ca), (tb, cb) in zip(points, points[1:]):
        if t <= tb:
            return ca + (cb - ca) * (t - ta) / (tb - ta) if tb > ta else cb
    return points[-1][1]


# -- horovodrun -------------------------------------------------------------------------
def _launched(
    what: str,
    cmd_for,
    np: int,
    out_dir: str | Path,
    tag: str,
    env_extra: dict[str, str],
    timeout: float,
    log_path: str | Path | None,
) -> dict:
    """Run the launcher ``cmd_for(started)`` (a new session, so its group can be killed) with
    ``env_extra`` as the thread variables; rank records and socket findings of its tree."""
    env = dict(os.environ)
    for var in workload.THREAD_VARS:
        env.pop(var, None)
    env.update(env_extra)
    started = time.time()
    log_path = Path(log_path or Path(out_dir) / f"{tag}.log")
    with open(log_path, "w") as logf:
        proc = subprocess.Popen(
            cmd_for(started), env=env, cwd=str(ROOT), stdout=logf, stderr=subprocess.STDOUT, start_new_session=True
        )
        with Listeners(proc.pid, every=1.0) as listeners:
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the group the launcher leads (started above)
                proc.wait()
                raise RuntimeError(f"{what} {tag} took over {timeout} s; log: {log_path}")
    if code != 0:
        tail = log_path.read_text()[-3000:]
        raise RuntimeError(f"{what} {tag} exited with {code}; log {log_path}:\n{tail}")
    return {
        "ranks": read_ranks(out_dir, tag, np),
        "started": started,
        "exposed": listeners.exposed,
        "listeners": sorted(listeners.seen),
        "watch": listeners,
    }


def horovodrun(
    steps: int,
    out_dir: str | Path,
    tag: str,
    env_extra: dict[str, str],
    timeout: float = 600,
    log_path: str | Path | None = None,
    np: int = 2,
) -> dict:
    """One ``horovodrun -np N --gloo`` run of the workload; rank records and socket findings."""
    return _launched(
        "horovodrun",
        lambda started: [
            PY,
            str(BENCH / "horovodrun_lo.py"),
            "-np",
            str(np),
            "--gloo",
            "-H",
            f"localhost:{np}",
            "--network-interface",
            "lo",
            PY,
            str(BENCH / "hvd_train.py"),
            "--steps",
            str(steps),
            "--out",
            str(out_dir),
            "--tag",
            tag,
            "--started",
            repr(started),
        ],
        np,
        out_dir,
        tag,
        env_extra,
        timeout,
        log_path,
    )


def tf_workers(
    steps: int, out_dir: str | Path, tag: str, env_extra: dict[str, str], timeout: float = 600, np: int = 2
) -> dict:
    """TensorFlow's own multi-worker launch of the workload: ``mwms_train.py --launch N`` starts
    N workers with ``TF_CONFIG`` on loopback ports (as one would by hand) and waits for them."""
    return _launched(
        "TF workers",
        lambda started: [
            PY,
            str(BENCH / "mwms_train.py"),
            "--launch",
            str(np),
            "--steps",
            str(steps),
            "--out",
            str(out_dir),
            "--tag",
            tag,
            "--started",
            repr(started),
        ],
        np,
        out_dir,
        tag,
        env_extra,
        timeout,
        None,
    )


# -- a real kernel ----------------------------------------------------------------------
class CellError(RuntimeError):
    pass


class Kernel:
    """An IPython kernel driven over ZMQ by ``jupyter_client``, as a notebook would drive it."""

    MARK = "@@kdist-bench@@"

    def __init__(self, cwd: str | Path = ROOT, startup_timeout: float = 120):
        from jupyter_client import KernelManager

        # ipc: the kernel's five channels are Unix sockets in the temp runtime dir, no TCP port
        # (absolute path: the kernel runs in ``cwd``, this process may not)
        base = Path(tempfile.mkdtemp(prefix="kernel-", dir=HOME / "jupyter-runtime"))
        self.km = KernelManager(
            kernel_name="python3", transport="ipc", ip=str(base / "ipc"), connection_file=str(base / "connection.json")
        )
        self.km.start_kernel(env=dict(os.environ), cwd=str(cwd))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=startup_timeout)
        self.pid = self.km.provisioner.process.pid
        self.child_pids: set[int] = set()

    def run(self, code: str, timeout: float = 600, quiet: bool = True) -> dict:
        """Execute ``code``; returns ``{submitted, done, text, status}``, raises CellError on error.

        ``submitted`` is ``time.time()`` just before the execute request is sent.
        """
        submitted = time.time()
        msg_id = self.kc.execute(code, store_history=False)
        text: list[str] = []
        error = None
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CellError(f"cell did not finish within {timeout} s:\n{code[:300]}")
            try:
                msg = self.kc.get_iopub_msg(timeout=min(remaining, 5))
            except Exception:
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = msg["header"]["msg_type"], msg["content"]
            if kind == "stream":
                text.append(content["text"])
                if not quiet:
                    sys.stderr.write(content["text"])
            elif kind == "error":
                error = "\n".join(content.get("traceback", [])) or content.get("evalue")
            elif kind == "status" and content.get("execution_state") == "idle":
                break
        done = time.time()
        reply = self.kc.get_shell_msg(timeout=30)
        while reply.get("parent_header", {}).get("msg_id") != msg_id:
            reply = self.kc.get_shell_msg(timeout=30)
        status = reply["content"]["status"]
        out = "".join(text)
        if status != "ok" or error:
            import re

            plain = re.sub(r"\x1b\[[0-9;]*m", "", error or reply["content"].get("evalue", ""))
            raise CellError(
                f"cell failed:\n{code[:400]}\n--- output ---\n{out[-2000:]}\n--- error ---\n{plain[-3000:]}"
            )
        return {"submitted": submitted, "done": done, "text": out, "status": status}

    def value(self, expression: str):
        """The JSON value of ``expression`` evaluated in the kernel."""
        out = self.run(f"import json as _kb_json\nprint({self.MARK!r} + _kb_json.dumps({expression}))")
        for line in out["text"].splitlines():
            if line.startswith(self.MARK):
                return json.loads(line[len(self.MARK) :])
        raise CellError(f"no value for {expression!r} in {out['text'][-500:]!r}")

    def remember_children(self) -> None:
        """Note every process the kernel started (controller, engines), to check they end."""
        import psutil

        try:
            self.child_pids |= {p.pid for p in psutil.Process(self.pid).children(recursive=True)}
        except psutil.Error:
            pass

    def close(self) -> list[int]:
        """``%kdist stop``, shut the kernel down; kill (by pid) anything it left. Returns those pids."""
        import psutil

        self.remember_children()
        try:
            self.run(
                "import sys as _kb_sys\n"  # what %kdist stop does, if kdist was loaded
                "if getattr(_kb_sys.modules.get('kdist_magics'), '_extension', None):\n"
                "    get_ipython().run_line_magic('kdist', 'stop')",
                timeout=60,
            )
        except Exception as exc:
            log(f"bench: %kdist stop failed: {exc}")
        try:
            self.kc.stop_channels()
            self.km.shutdown_kernel(now=False)
        except Exception:
            self.km.shutdown_kernel(now=True)
        left = []
        for pid in sorted(self.child_pids | {self.pid}):
            try:
                proc = psutil.Process(pid)
                if proc.status() != psutil.STATUS_ZOMBIE:
                    left.append(pid)
                    proc.kill()
            except psutil.Error:
                pass
        return left


# -- the kdist side ------------------------------------------------------------------------
KERNEL_SETUP = r"""
%load_ext kdist_magics
import time as _kb_time
import kdist_magics

class _KBArrivals:
    # Benchmark only: note when each step row has landed in the record (P5).
    arrivals = []

    @staticmethod
    def watch(record):
        def listener(kind, row):
            if kind == "metric" and row.get("kind") == "step":
                _KBArrivals.arrivals.append([_kb_time.time(), row.get("rank"), row.get("step"),
                                             row.get("time")])
        record.subscribe(listener)

kdist_magics._extension.observe_runs(_KBArrivals.watch)

def _kb_run_facts():
    rec = kdist_magics.last_run()
    strategy = kdist_magics._extension._strategies.get("horovod")
    arrivals, _KBArrivals.arrivals[:] = list(_KBArrivals.arrivals), []
    return {"status": rec.status, "error": rec.error, "rows": len(rec.metrics),
            "arrivals": arrivals, "timing": getattr(strategy, "last_timing", {}),
            "lost_batches": rec.lost_batches}
"""


def kdist_cell(
    steps: int, out_dir: str | Path, tag: str, options: str = "", np: int = 2, strategy: str = "horovod"
) -> str:
    """The ``%%kdist`` cell that runs the shared workload on N Horovod ranks (``strategy``
    "multiworker": on N MultiWorkerMirroredStrategy workers, ``workload.train_multiworker``)."""
    call = "workload.train(hvd, " if strategy == "horovod" else "workload.train_multiworker(strategy, "
    return (
        f"%%kdist --strategy {strategy} --np {np} {options}\n"
        f"import sys\n"
        f"sys.path.insert(0, {str(BENCH)!r})\n"
        f"import workload\n"
        f"_kb = {call}{steps}, {str(out_dir)!r}, {tag!r})\n"
    )


def kdist_run(
    kernel: Kernel, steps: int, out_dir: str | Path, tag: str, options: str = "", np: int = 2, strategy: str = "horovod"
) -> dict:
    """Run the workload cell in ``kernel``; rank records, kernel-side facts, sockets."""
    with Listeners(kernel.pid, every=1.0) as listeners:
        cell = kernel.run(kdist_cell(steps, out_dir, tag, options, np, strategy))
        listeners.sample()  # CPU up to the cell's end
    kernel.remember_children()
    facts = kernel.value("_kb_run_facts()")
    if facts["status"] != "done":
        raise RuntimeError(f"kdist run {tag}: {facts['status']}: {facts['error']}")
    ranks = read_ranks(out_dir, tag, np)
    # CPU the kernel, the controller and helpers (everything but the ranks) used during the cell
    side = listeners.cpu_seconds(exclude={r["pid"] for r in ranks})
    wall = cell["done"] - cell["submitted"]
    return {
        "ranks": ranks,
        "submitted": cell["submitted"],
        "facts": facts,
        "exposed": listeners.exposed,
        "listeners": sorted(listeners.seen),
        "watch": listeners,
        "side_cpu": side,
        "side_cpu_share": sum(side.values()) / wall if wall > 0 else None,
    }


def rate(run: dict, warmup: int) -> float:
    """Steady-state steps/s of a run, from rank 0's step-end times."""
    return workload.step_rate(run["ranks"][0]["step_ends"], warmup)


def cpu_rate(run: dict, warmup: int) -> dict:
    """Steady-state steps per CPU-second of *every* process of the run, and where the CPU went.

    Ranks: their own ``time.process_time()`` at step ends (exact). Everything else the
    launcher started or is (kernel, ipyparallel controller / horovodrun's launcher):
    sampled every second, interpolated over the same window. Contention from other
    programs stretches wall time but hardly CPU time, so this ratio stays put on a
    shared machine where steps/s does not.
    """
    ranks = run["ranks"]
    ends = ranks[0]["step_ends"]
    t0, t1 = ends[warmup], ends[-1]
    steps = len(ends) - 1 - warmup
    rank_cpu = sum(r["step_cpu"][-1] - r["step_cpu"][warmup] for r in ranks)
    by_process = run["watch"].cpu_between_by_process(t0, t1, exclude={r["pid"] for r in ranks})
    side_cpu = sum(by_process.values())
    return {
        "steps_per_cpu_s": steps / (rank_cpu + side_cpu),
        "rank_cpu_per_step": rank_cpu / steps,
        "side_cores_by_process": {k: round(v / (t1 - t0), 4) for k, v in by_process.items() if v > 0},
        "side_cpu_per_step": side_cpu / steps,
        "window_s": t1 - t0,
        "cores_busy": (rank_cpu + side_cpu) / (t1 - t0),
    }


def fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def machine() -> dict:
    import platform

    import psutil

    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count()
    model = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpus": cpus,
        "cpu_model": model,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
