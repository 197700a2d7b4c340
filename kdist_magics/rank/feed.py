"""The telemetry feed, both sides: rows from a rank to the kernel over the engine's IOPub.

On the engine, :class:`Feed` buffers ``sink(kind, row)`` rows, numbers each batch (``seq``)
and publishes it every ``interval`` seconds as one ``display_data`` message of MIME type
:data:`FEED_MIME`, parented to the running cell's request (captured by a ``pre_run_cell``
hook; a ``post_run_cell`` hook publishes the rest while that request is still open). In the
kernel, :class:`FeedIntake` puts each batch's rows into the run's RunRecord once (a batch seen
live and again in the final drain counts once) and counts the batches that never came
(:attr:`FeedIntake.lost`; the words for them: :func:`kdist_magics.messages.lost_batches`).
IOPub is ordered and the kernel sees every message of an open request, so no row is lost in
practice, and the feed needs no extra socket.
"""

from __future__ import annotations

import threading
from typing import Any

FEED_MIME = "application/vnd.kdist.feed+json"


class Feed:
    """Buffered, sequence-numbered telemetry rows published over IOPub."""

    def __init__(self, rank: int, interval: float = 0.25, publisher=None):
        self.rank = rank
        self.publisher = publisher  # default: the engine shell's display publisher
        self.interval = interval
        self.seq = 0
        self.rows: list[list[Any]] = []
        self.lock = threading.Lock()
        self.parent: dict | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sink(self, kind: str, row: dict[str, Any]) -> None:
        with self.lock:
            self.rows.append([kind, row])

    def _pub(self):
        if self.publisher is not None:
            return self.publisher
        from IPython import get_ipython

        shell = get_ipython()
        return shell.display_pub if shell is not None else None

    def flush(self, parent: dict | None = None) -> None:
        pub = self._pub()
        with self.lock:
            # read under the lock: after disarm() no batch may carry the finished cell's parent
            parent = parent if parent is not None else self.parent
            if not self.rows or parent is None or pub is None:
                return
            rows, self.rows = self.rows, []
            self.seq += 1
            payload = {"rank": self.rank, "seq": self.seq, "rows": rows}
            try:
                from ipykernel.jsonutil import json_clean
            except ImportError:  # pragma: no cover

                def json_clean(x):
                    return x

            # ipykernel's DisplayPublisher sends to the open cell only; a batch must carry the
            # parent the cell had when the row was made, so kdist sends through its session
            # (session, pub_socket, topic: ipykernel 6.17 to 7.x)
            pub.session.send(
                pub.pub_socket,
                "display_data",
                json_clean({"data": {FEED_MIME: payload}, "metadata": {}, "transient": {}}),
                parent=parent,
                ident=getattr(pub, "topic", None),
            )

    def arm(self, *args) -> None:
        """``pre_run_cell`` hook: rows published from now on belong to this cell's request."""
        self.parent = dict(self._pub().parent_header)
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="kdist-feed", daemon=True)
            self._thread.start()

    def disarm(self, *args) -> None:
        """``post_run_cell`` hook: publish what is left while the cell's request is still open
        (a batch sent after its IOPub idle would reach nobody), then stop parenting to it."""
        self.flush()
        with self.lock:
            self.parent = None

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.flush()
            except Exception:  # never break training over telemetry
                pass

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None


class FeedIntake:
    """The kernel's side: batches into ``record``, each once; gaps in the numbering counted."""

    def __init__(self, record):
        self.record = record
        self.seen: dict[int, set[int]] = {}

    def take(self, rank: int, content: dict) -> None:
        """One ``display_data`` content; anything that is not a feed batch is ignored."""
        payload = content.get("data", {}).get(FEED_MIME)
        if not payload:
            return
        seq = payload.get("seq", 0)
        seen = self.seen.setdefault(rank, set())
        if seq in seen:
            return  # already delivered (seen live and again in the final drain)
        seen.add(seq)
        for kind, row in payload.get("rows", []):
            try:
                self.record.add(kind, row)
            except ValueError:
                pass

    @property
    def lost(self) -> int:
        """Batches that never arrived (gaps in the ranks' numbering)."""
        return sum(max(seen) - len(seen) for seen in self.seen.values() if seen)
