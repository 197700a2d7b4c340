"""Processes that follow the kernel from their first instant.

``python -m kdist_magics.cluster.follow PID STARTED MODULE ARGS...`` runs ``MODULE`` (ipyparallel's
controller or engine) as ``__main__``, after starting a thread that waits for process PID
(created at STARTED, so a reused pid is never taken for it) to end; then it kills this
process's children (an engine's nanny, the controller's schedulers) and itself.

kdist starts an owned cluster's controller and engines through this (their launchers'
``controller_cmd`` / ``engine_cmd``), so a kernel that is killed at any moment, even while
the engines are still starting, takes them with it: a killed kernel runs no ``atexit``, and
ipyparallel has no such option. The watcher (:mod:`.lifetime`) sleeps on a pidfd (Linux),
waking only when the kernel ends; elsewhere it looks every half second. A small guard process
(``--guard``) does the same from outside, since a thread cannot run while the process's
interpreter lock is held for seconds (TensorFlow's import does that). ``--netns HOLDER`` first joins a cluster's
private network (:mod:`.namespace`).

An engine starts with TensorFlow's C++ INFO lines off (:data:`QUIET_TF_CPP`) unless the
kernel's environment says otherwise: the engine forwards its process's stderr into the cell's
output, where with ``--out all`` every rank's copy of each line ("oneDNN custom operations are
on", "Memory patch applied", gRPC and collective set-up lines) would crowd out the cell's own.
Warnings and errors still show.
"""

from __future__ import annotations

import os
import sys
import threading

from .lifetime import alive, descendants, end_groups, end_with, live_in_group

#: TensorFlow's C++ log level on the engines kdist starts: 1 hides INFO, keeps WARNING and ERROR;
#: TensorFlow reads it once, at its first log line, so it is set before anything imports it
QUIET_TF_CPP = {"TF_CPP_MIN_LOG_LEVEL": "1"}


def quiet_tf_cpp(env) -> None:
    """Set :data:`QUIET_TF_CPP` in ``env`` where the kernel's environment has not set it."""
    for name, value in QUIET_TF_CPP.items():
        env.setdefault(name, value)


def command(
    module: str,
    pid: int | None = None,
    started: float | None = None,
    nice: int = 0,
    netns: int | None = None,
    preload: tuple[str, ...] = (),
    threads: int = 0,
    ranks: int = 1,
) -> list[str]:
    """The command line that runs ``python -m module`` following process ``pid`` (this one),
    ``nice`` added to its priority (the controller: it and its schedulers run beside the ranks),
    inside the namespaces of holder ``netns`` (:mod:`.namespace`) when given, importing
    ``preload`` first (:func:`preload`, ``threads`` each for ``ranks`` ranks on this host)."""
    import psutil

    if pid is None:
        pid = os.getpid()
    if started is None:
        started = psutil.Process(pid).create_time()
    return [
        sys.executable,
        "-m",
        "kdist_magics.cluster.follow",
        *(["--netns", str(netns)] if netns else []),
        *(["--nice", str(nice)] if nice else []),
        *(["--preload", ",".join(preload), "--threads", str(threads), "--ranks", str(ranks)] if preload else []),
        str(pid),
        repr(started),
        module,
    ]


def preload(modules: list[str], threads: int, ranks: int = 1) -> str:
    """Import ``modules`` (a strategy's framework) in an engine before it registers, so the
    import runs while the controller and the other engines start rather than after them;
    the thread variables first, as the run sets them (``threads`` per rank, ``ranks`` ranks on
    this host: :func:`kdist_magics.rank.lifecycle.thread_env`). Not where NVIDIA
    GPUs are visible: a rank's GPU is chosen when its run starts (as ``%kdist start`` does).
    A failing import is left to the run, which imports again and names the error. Returns
    what was done."""
    import importlib

    from ..rank.lifecycle import thread_env
    from .placement import visible_gpus

    if visible_gpus(os.environ):
        return "skipped: GPUs here"
    os.environ.update(thread_env(threads, ranks))
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - the run's own import says it in the cell
            return f"{name} failed: {type(exc).__name__}: {exc}"
    return "imported " + ", ".join(modules)


def guard(pid: int, started: float, target: int, group: bool = False) -> None:
    """``python -m kdist_magics.cluster.follow --guard PID STARTED TARGET [--group]``: a small
    process of its own that ends process TARGET and every process it started once PID is gone,
    and what TARGET started once TARGET ends first. A thread inside TARGET is not enough: while
    TARGET imports TensorFlow, the import holds its interpreter lock for seconds, and a thread
    there cannot run; and a process TARGET forked (the controller's schedulers) outlives TARGET
    when TARGET is killed, its parent then being init. So where TARGET leads a process group of
    its own (``group``: :func:`main` made it so), which forked children stay in wherever their
    parent is, the guard ends that group too, even when TARGET was gone before it looked."""
    import select

    import psutil

    if not hasattr(os, "pidfd_open"):  # no pidfds here: the thread in TARGET does the work
        return
    try:
        target_fd = os.pidfd_open(target)
    except OSError:
        target_fd = None  # gone already (killed as it started): its group may not be
    if target_fd is not None and alive(pid, started):
        try:
            select.select([os.pidfd_open(pid), target_fd], [], [])
        except OSError:
            pass
    try:
        proc = psutil.Process(target) if target_fd is not None else None
    except psutil.Error:
        proc = None
    me = os.getpid()
    for _ in range(3):  # TARGET may be starting a child (an engine its nanny) just now
        for child in descendants(proc) if proc is not None else ():
            if child.pid != me:
                try:
                    child.kill()
                except psutil.Error:
                    pass
        try:
            if proc is not None:
                proc.kill()
        except psutil.Error:
            pass
        if group:
            end_groups([target])
        threading.Event().wait(0.05)
    if group:  # one forked as TARGET died can show in its group after those kills (CI once)
        _end_group_until_empty(target, within=5.0)
    from .lifetime import remove_segments

    remove_segments(of_pid=target)  # an engine's own: another host's first engine makes some
    if not alive(pid, started):  # the kernel died, maybe in the middle of a --push
        remove_segments(of_pid=pid)


def _end_group_until_empty(pgid: int, within: float) -> None:
    """Kill process group ``pgid`` again while a live process is left in it, for ``within``
    seconds at most: a child its leader was forking as it was killed can join the group a
    moment after the first kills (CI saw a controller's scheduler outlive them once)."""
    import time

    deadline = time.monotonic() + within
    while live_in_group(pgid) and time.monotonic() < deadline:
        end_groups([pgid])
        threading.Event().wait(0.05)


def lead_own_group() -> bool:
    """Make this process lead a process group of its own (ipyparallel's launchers start it as a
    session leader already), so that what it forks can be found and ended after it; whether
    it does."""
    try:
        if os.getpgid(0) != os.getpid():
            os.setpgid(0, 0)
        return os.getpgid(0) == os.getpid()
    except OSError:
        return False


def main(argv: list[str]) -> None:
    import runpy
    import subprocess

    if argv[0] == "--guard":
        guard(int(argv[1]), float(argv[2]), int(argv[3]), argv[4:] == ["--group"])
        return
    if argv[0] == "--netns":  # first, while this process has one thread (setns needs that)
        from .namespace import enter

        enter(int(argv[1]))
        argv = argv[2:]
    if argv[0] == "--nice":
        try:
            os.nice(int(argv[1]))  # before anything starts: its threads and children inherit it
        except (AttributeError, OSError):
            pass
        argv = argv[2:]
    modules, threads, ranks = [], 0, 1
    if argv[0] == "--preload":  # --preload a,b --threads N --ranks M
        modules, threads, ranks, argv = argv[1].split(","), int(argv[3]), int(argv[5]), argv[6:]
    pid, started, module, *rest = argv
    group = lead_own_group()
    end_with(int(pid), float(started))
    # the guard: started before the module (and its heavy imports) runs, outside this group
    subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kdist_magics.cluster.follow",
            "--guard",
            pid,
            started,
            str(os.getpid()),
            *(["--group"] if group else []),
        ],
        stdin=subprocess.DEVNULL,
        close_fds=True,
        start_new_session=True,
    )
    if module == "ipyparallel.controller":
        from .compat_ipyparallel import ipc_urls_as_read

        ipc_urls_as_read()
    if module == "ipyparallel.engine":
        quiet_tf_cpp(os.environ)
    if modules:  # after the guard: an import holds this process's lock for seconds
        os.environ["KDIST_PRELOADED"] = preload(modules, threads, ranks)
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
