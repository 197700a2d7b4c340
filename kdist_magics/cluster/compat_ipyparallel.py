"""Workarounds for ipyparallel's internals, in one place (checked against 8.8.0, Colab's, and
9.2.0). Each reaches into a private part; an upgrade that changes one touches this file only.
None of these is reported upstream as a bug (searched ipyparallel's issues, Dec 2026): they
follow from running a synchronous Cluster inside a notebook kernel's event loop.
"""

from __future__ import annotations

from typing import Any


def children(ar) -> list:
    """The per-engine futures of an AsyncResult (``ar._children``, 8.x-9.x): kdist listens to
    each rank's IOPub and finishing separately."""
    return list(ar._children)


class LauncherExits:
    """Engine and controller exit codes as they happen (8.8-9.2).

    A local launcher's watcher thread learns an engine's exit code at once but hands it to
    ``notify_stop`` through the IOLoop the cluster was started on, which in a synchronous
    (notebook) session only turns during the next cluster call. :meth:`attach` points the
    launchers at a small IOLoop of kdist's own (``launcher.loop``), so the exit status is there
    within milliseconds; ipyparallel drops a stopped engine's launcher from its set at once,
    so each status is kept here, by pid (:attr:`codes`). :meth:`restore` gives the launchers
    their loop back before ipyparallel stops them (its stop bookkeeping must not race with exit
    notifications on kdist's thread); :meth:`close` ends kdist's loop.
    """

    def __init__(self):
        self.loop = None
        self.replaced: list[tuple[Any, Any]] = []
        self.codes: dict[int, Any] = {}

    def attach(self, cluster) -> None:
        import asyncio
        import queue
        import threading

        from tornado.ioloop import IOLoop

        if self.loop is None:
            box: queue.SimpleQueue = queue.SimpleQueue()

            def run():
                asyncio.set_event_loop(asyncio.new_event_loop())
                loop = IOLoop.current()
                box.put(loop)
                try:
                    loop.start()
                finally:  # stopped by close(): release its selector and wake-up pipe
                    loop.close()

            threading.Thread(target=run, name="kdist-engine-exits", daemon=True).start()
            self.loop = box.get(timeout=10)
        launchers = [
            launcher
            for engine_set in getattr(cluster, "engines", {}).values()
            for launcher in getattr(engine_set, "launchers", {}).values()
        ]
        controller = getattr(cluster, "controller", None)
        done = {id(launcher) for launcher, _ in self.replaced}
        for launcher in ([controller] if controller is not None else []) + launchers:
            if id(launcher) in done:  # attached already (attach runs after each start step)
                continue
            try:
                self.replaced.append((launcher, launcher.loop))
                launcher.loop = self.loop
                launcher.on_stop(
                    lambda data, codes=self.codes: codes.__setitem__(data.get("pid"), data.get("exit_code"))
                )
            except Exception:
                pass

    def restore(self) -> None:
        for launcher, loop in self.replaced:
            try:
                launcher.loop = loop
            except Exception:
                pass
        self.replaced = []

    def close(self) -> None:
        loop, self.loop = self.loop, None
        if loop is not None:
            loop.add_callback(loop.stop)


def end_sync_thread(obj) -> None:
    """End the IOLoop thread ipyparallel starts for ``*_sync`` calls made inside a running event
    loop (a notebook kernel) and never ends (``_thread_loop``/``_async_thread``, 8.x-9.x): each
    cluster would otherwise keep a thread, a selector and a wake-up socket pair for the rest of
    the session."""
    loop, thread = getattr(obj, "_thread_loop", None), getattr(obj, "_async_thread", None)
    if loop is None or thread is None:
        return
    try:
        loop.add_callback(loop.stop)
        thread.join(timeout=5)
        if not thread.is_alive():
            loop.close()
    except Exception:
        pass


def registration_url(client) -> str | None:
    """The controller's registration address a Client connected to (``tcp://HOST:PORT``, from
    the connection file; ``client._config['registration']``, 8.x-9.x), or None: kdist watches an
    attached cluster's controller through the process listening there, when it is on this host."""
    url = (getattr(client, "_config", None) or {}).get("registration")
    return url if isinstance(url, str) and url.startswith("tcp://") else None


def ipc_urls_as_read() -> None:
    """The controller binds ``ipc`` URLs as its connection files are read (8.8-9.2).

    ``IPController.construct_url`` joins an ``ipc://PATH`` interface and a port with ``-``
    (``PATH-PORT``), but the client and the engines (``Client``, ``IPEngine``) join what the
    connection file says with ``:``, so with ``--transport=ipc`` nobody reaches the hub
    ("Hub connection request timed out"). Run in the controller's process before it starts
    (``kdist_magics.cluster.follow`` does): the controller then binds ``PATH:PORT`` too. A no-op for
    ``tcp``. Not reported upstream (searched ipyparallel's issues, Dec 2026).
    """
    from ipyparallel.controller.app import IPController

    if getattr(IPController.construct_url, "_kdist", False):
        return
    original = IPController.construct_url

    def construct_url(self, kind, channel, index=None):
        url = original(self, kind, channel, index)
        info = {"engine": self.engine_info, "client": self.client_info}.get(kind) or self.internal_info
        interface = info["interface"]
        if interface.startswith("ipc://") and url.startswith(interface + "-"):
            url = f"{interface}:{url[len(interface) + 1 :]}"
        return url

    construct_url._kdist = True
    IPController.construct_url = construct_url
