"""A real IPython kernel driven over ZMQ by jupyter_client, as a notebook front end drives it.

Shared by ``tests/test_failures_kernel.py`` and ``benchmarks/soak.py`` /
``benchmarks/failure_times.py``; its :func:`isolated_env` is the one place every test
tier and benchmark gets fresh IPython/Jupyter folders from. Every IOPub message the kernel sends is kept
(``messages``), so a test can look at exactly what the notebook would show.
Processes are found and ended by pid only (the kernel's own tree).
"""

from __future__ import annotations

import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ANSI = re.compile(r"\x1b\[[0-9;]*m")
LOOPBACK = ("127.0.0.1", "::1")


#: per-user state that tests, notebooks and benchmarks must never read or write
STATE_DIRS = (
    ("IPYTHONDIR", "ipython"),
    ("JUPYTER_CONFIG_DIR", "jupyter-config"),
    ("JUPYTER_DATA_DIR", "jupyter-data"),
    ("JUPYTER_RUNTIME_DIR", "jupyter-runtime"),
    ("MPLCONFIGDIR", "mpl"),
)


def isolated_env(
    home: Path | None = None, *, env: dict | None = None, keras_backend: str | None = "tensorflow", **extra: str
) -> dict[str, str]:
    """``env`` (default: a copy of os.environ) with IPython, Jupyter and matplotlib state in
    fresh folders under ``home`` (default: a new temp folder), never the user's.

    The one place tests, the notebook and browser tiers and the benchmarks get their
    isolation from. ``keras_backend``: a default for ``KERAS_BACKEND`` (kept when already
    set), ``None`` to remove it (notebooks choose their own backend). ``extra``: variables to
    set on top (``PYTHONWARNINGS="ignore"``, ...). Pass ``env=os.environ`` to isolate this
    process itself (before anything reads those variables).
    """
    home = Path(home or tempfile.mkdtemp(prefix="kdist-kernel-"))
    env = dict(os.environ) if env is None else env
    for var, sub in STATE_DIRS:
        (home / sub).mkdir(parents=True, exist_ok=True)
        env[var] = str(home / sub)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if keras_backend is None:
        env.pop("KERAS_BACKEND", None)
    else:
        env.setdefault("KERAS_BACKEND", keras_backend)
    env.update(extra)
    return env


class Result:
    """What one execute request produced on IOPub, plus its shell reply."""

    def __init__(self, msg_id: str):
        self.msg_id = msg_id
        self.messages: list[dict] = []
        self.reply: dict | None = None
        self.submitted = time.monotonic()
        self.finished: float | None = None

    @property
    def errors(self) -> list[dict]:
        return [m["content"] for m in self.messages if m["header"]["msg_type"] == "error"]

    @property
    def stdout(self) -> str:
        return "".join(
            m["content"]["text"]
            for m in self.messages
            if m["header"]["msg_type"] == "stream" and m["content"]["name"] == "stdout"
        )

    @property
    def stderr(self) -> str:
        return "".join(
            m["content"]["text"]
            for m in self.messages
            if m["header"]["msg_type"] == "stream" and m["content"]["name"] == "stderr"
        )

    @property
    def text(self) -> str:
        """Every text the notebook would show for this cell (streams, results, errors), ANSI-free."""
        return ANSI.sub("", "\n".join(message_text(m) for m in self.messages))

    @property
    def status(self) -> str | None:
        return self.reply["content"]["status"] if self.reply else None

    @property
    def ok(self) -> bool:
        return self.status == "ok" and not self.errors

    @property
    def seconds(self) -> float | None:
        return None if self.finished is None else self.finished - self.submitted

    def value(self):
        """The cell's ``text/plain`` result, if any."""
        for m in self.messages:
            if m["header"]["msg_type"] == "execute_result":
                return m["content"]["data"].get("text/plain")
        return None


def message_text(msg: dict) -> str:
    """All human-readable text in one IOPub message."""
    c = msg.get("content", {})
    kind = msg["header"]["msg_type"]
    if kind == "stream":
        return c.get("text", "")
    if kind == "error":
        return "\n".join([c.get("ename", ""), c.get("evalue", ""), *c.get("traceback", [])])
    if kind in ("execute_result", "display_data", "update_display_data"):
        return "\n".join(str(v) for v in c.get("data", {}).values())
    if kind == "comm_msg" or kind == "comm_open":
        return repr(c.get("data", ""))
    return ""


class Kernel:
    """One IPython kernel (``python3`` = this Python) with kdist loaded."""

    def __init__(
        self, cwd: str | Path | None = None, env: dict | None = None, startup_timeout: float = 180, load: bool = True
    ):
        from jupyter_client import KernelManager

        self.env = dict(env or isolated_env())
        self.env.setdefault("PYTHONWARNINGS", "ignore")  # output is asserted on: no warning noise
        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(env=self.env, cwd=str(cwd or os.getcwd()))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=startup_timeout)
        self.pid = self.km.provisioner.process.pid
        self.messages: list[dict] = []  # every IOPub message, in order
        self.seen_pids: set[int] = set()
        if load:
            self.check("%load_ext kdist_magics")

    # -- running cells ------------------------------------------------------------------
    def execute(
        self, code: str, timeout: float = 300, on_message: Callable[[dict, "Result"], None] | None = None
    ) -> Result:
        """Run ``code``; wait for its IOPub idle and its reply (``timeout`` s in all)."""
        return self.wait_for(self.send(code), timeout, on_message, code)

    def send(self, code: str) -> str:
        """Send ``code`` to run and return its message id at once (``wait_for`` collects it).

        Sent with ``stop_on_error=False``: tests never queue a cell behind another, and after
        a failing cell ipykernel 6.17 (Colab's) aborts every request that arrives before a
        callback it schedules has run (``Kernel._abort_queues``): a next cell sent at once came
        back "aborted", without output, 28 times in 40 (0 with ``stop_on_error=False``, 0 on
        ipykernel 7.4), where a person's next cell would run."""
        return self.kc.execute(code, store_history=False, stop_on_error=False)

    def wait_for(
        self,
        msg_id: str,
        timeout: float = 300,
        on_message: Callable[[dict, "Result"], None] | None = None,
        code: str = "",
    ) -> Result:
        """The result of the execute request ``msg_id`` sent earlier (see :meth:`execute`)."""
        res = Result(msg_id)
        deadline = time.monotonic() + timeout
        idle = False
        while not idle:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"cell did not finish within {timeout} s:\n{code[:300]}\n--- so far ---\n{res.text[-2000:]}"
                )
            try:
                msg = self.kc.get_iopub_msg(timeout=min(remaining, 1))
            except Exception:
                continue
            msg["received"] = time.time()  # wall clock: comparable with the engines' clocks
            self.messages.append(msg)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            res.messages.append(msg)
            if msg["header"]["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                idle = True
                res.finished = time.monotonic()
            elif on_message is not None:
                on_message(msg, res)
        while res.reply is None:
            reply = self.kc.get_shell_msg(timeout=max(5, deadline - time.monotonic()))
            if reply.get("parent_header", {}).get("msg_id") == msg_id:
                res.reply = reply
        return res

    def check(self, code: str, timeout: float = 300) -> Result:
        """Run ``code`` and fail loudly if it raised."""
        res = self.execute(code, timeout)
        if not res.ok:
            raised = "; ".join(f"{e['ename']}: {e['evalue']}" for e in res.errors) or f"reply status {res.status!r}"
            raise AssertionError(f"cell failed ({raised}):\n{code[:400]}\n--- output ---\n{res.text[-3000:]}")
        return res

    def eval(self, expression: str, timeout: float = 120):
        """The value of a Python ``expression`` in the kernel (via repr/literal_eval)."""
        import ast

        res = self.check(f"print('@@kd@@' + repr({expression}))", timeout)
        for line in res.stdout.splitlines():
            if line.startswith("@@kd@@"):
                return ast.literal_eval(line[len("@@kd@@") :])
        raise AssertionError(f"no value for {expression!r}: {res.text[-500:]!r}")

    # -- processes ------------------------------------------------------------------------
    def tree(self) -> list[int]:
        """Pids of the kernel and every process below it (controller, engines, nannies...)."""
        import psutil

        try:
            root = psutil.Process(self.pid)
            pids = [self.pid] + [p.pid for p in root.children(recursive=True)]
        except psutil.Error:
            return []
        self.seen_pids |= set(pids)
        return pids

    def children(self) -> list[int]:
        return [p for p in self.tree() if p != self.pid]

    def listening(self) -> list[tuple[int, str, int]]:
        """(pid, ip, port) of every listening TCP socket of the kernel's process tree, in
        whichever network namespace it lies (the engines' private one too)."""
        return [(s["pid"], s["address"], s["port"]) for s in listening_sockets(self.tree())]

    def interrupt(self) -> None:
        self.km.interrupt_kernel()

    def kill(self) -> None:
        """SIGKILL the kernel process (by pid), as an OOM killer or a crash would."""
        self.tree()
        os.kill(self.pid, signal.SIGKILL)
        try:
            self.km.provisioner.process.wait(timeout=10)
        except Exception:
            pass
        try:
            self.kc.stop_channels()
        except Exception:
            pass

    def shutdown(self) -> None:
        """Ask the kernel to shut down, as the notebook's "Shut down kernel" does."""
        self.tree()
        try:
            self.kc.stop_channels()
        except Exception:
            pass
        try:
            self.km.shutdown_kernel(now=False)
        except Exception:
            self.km.shutdown_kernel(now=True)

    def cleanup(self) -> list[int]:
        """Kill (by pid) whatever of this kernel's recorded processes is still alive."""
        left = alive(self.seen_pids | {self.pid})
        import psutil

        for pid in left:
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
        return left


def alive(pids) -> list[int]:
    """The pids in ``pids`` that are still running (zombies count as gone)."""
    import psutil

    out = []
    for pid in sorted(set(pids)):
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.Error:
            pass
    return out


#: what a kernel defines before its cells, per strategy key of the fault matrix and the soak:
#: their JAX cells push 4 MiB (one shared-memory segment)
PRELUDE = {"jax": "import numpy as np\nkd_big = np.ones(2**20, dtype='float32')"}


def push_names(pid: int) -> list[str]:
    """``--push``'s shared-memory names of kernel ``pid`` still in ``/dev/shm``."""
    import glob

    return glob.glob(f"/dev/shm/kdist-{pid}-*")


def kernel_helpers(pids) -> set[int]:
    """Of ``pids``, Python's multiprocessing resource trackers: ``--push``'s first shared-memory
    segment starts one in the kernel, and it lives as long as the kernel (it ends when its pipe
    from the kernel closes, a killed kernel's too, removing any segment still registered), so
    it is no process kdist left behind."""
    import psutil

    found = set()
    for pid in pids:
        try:
            if "multiprocessing.resource_tracker" in " ".join(psutil.Process(pid).cmdline()):
                found.add(pid)
        except psutil.Error:
            pass
    return found


def wait_gone(pids, timeout: float = 90.0, every: float = 0.25) -> tuple[list[int], float]:
    """Poll until none of ``pids`` is alive; returns (still alive, seconds waited)."""
    t0 = time.monotonic()
    left = alive(pids)
    while left and time.monotonic() - t0 < timeout:
        time.sleep(every)
        left = alive(left)
    return left, time.monotonic() - t0


def connection_keys(env: dict) -> list[str]:
    """Every ``key`` in ipyparallel connection files under the kernel's IPYTHONDIR."""
    import json

    keys = []
    for path in Path(env["IPYTHONDIR"]).glob("profile_*/security/*.json"):
        try:
            key = json.loads(path.read_text()).get("key")
        except Exception:
            continue
        if key:
            keys.append(key if isinstance(key, str) else str(key))
    return keys


PY = sys.executable


# -- a fresh interpreter with its own IPython shell ----------------------------------
FRESH_SHELL_PRELUDE = """
import json, sys
from IPython.core.interactiveshell import InteractiveShell
import kdist_magics
ip = InteractiveShell.instance()
ip.run_line_magic("load_ext", "kdist_magics")
out = {}
def attempt(line, cell):
    try:
        return ip.run_cell_magic("kdist", line, cell), None
    except Exception as exc:
        return None, exc
def by_rank(name, strategy="multiworker"):
    s = kdist_magics._extension._strategies[strategy]
    return [v for _, v in sorted(zip(s.ranks(s.cluster, None), s.cluster.view().pull(name, block=True)),
                                 key=lambda t: t[0])]
"""


def run_in_fresh_shell(body: str, env: dict, unset: tuple[str, ...] = (), prefix: tuple[str, ...] = ()) -> dict:
    """Run ``body`` after :data:`FRESH_SHELL_PRELUDE` in a new Python (for frameworks that fix
    their devices at start-up); the body fills ``out``, which comes back as a dict (plus
    ``_stdout`` and ``_stderr``). ``prefix``: a command the Python runs under (``setpriv ...``)."""
    import json
    import subprocess
    import textwrap

    code = FRESH_SHELL_PRELUDE + textwrap.dedent(body) + "\nprint('RESULT ' + json.dumps(out))\n"
    full_env = {k: v for k, v in os.environ.items() if k not in unset}
    full_env.update(env)
    proc = subprocess.run(
        [*prefix, sys.executable, "-c", code], capture_output=True, text=True, timeout=400, env=full_env
    )
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    result = json.loads(lines[-1][len("RESULT ") :])
    result["_stdout"] = proc.stdout
    result["_stderr"] = proc.stderr
    return result


def engine_values(strategy, name: str) -> list:
    """``name`` from every engine's namespace, in rank order (read directly, not through kdist)."""
    values = strategy.cluster.view().pull(name, block=True)
    return [v for _, v in sorted(zip(strategy.ranks(strategy.cluster, None), values), key=lambda t: t[0])]


def engine_pids(strategy) -> set[int]:
    return {e.pid for e in strategy.cluster.engines}


# -- listening sockets, per network namespace ------------------------------------------------
def _decode(hex_address: str) -> tuple[str, int]:
    import socket

    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))  # each 32-bit word: host order
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, words), int(port, 16)


def _table(pid: int) -> dict[int, tuple[str, int]]:
    """inode -> (address, port) of the LISTEN sockets in process ``pid``'s network namespace."""
    out = {}
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                out[int(fields[9])] = _decode(fields[1])
    return out


def listening_sockets(pids) -> list[dict]:
    """Every listening TCP socket the processes ``pids`` hold, wherever its network:
    ``{pid, address, port, netns}``. Each process's own ``/proc/PID/net/tcp*`` is read (psutil
    reads the caller's namespace's table, so it misses the engines' private network), and a
    socket made in one namespace and held in another (the kernel's rendezvous, handed over
    from the engines' namespace) is listed in the namespace it lies in."""
    tables, found = {}, []
    for pid in pids:
        try:
            tables.setdefault(os.readlink(f"/proc/{pid}/ns/net"), _table(pid))
        except OSError:
            pass
    for pid in pids:
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        for inode in (int(link[8:-1]) for link in links if link.startswith("socket:[")):
            for netns, table in tables.items():
                if inode in table:
                    found.append({"pid": pid, "address": table[inode][0], "port": table[inode][1], "netns": netns})
    return found
