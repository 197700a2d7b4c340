"""``--tensorboard DIR``: every rank's step and epoch metrics as TensorBoard event files.

The kernel writes them, from the rows the ranks' telemetry already sends to the run's record,
so it works the same for every strategy and backend, needs neither TensorFlow nor TensorBoard
in the kernel, and costs the ranks nothing. One run directory per rank::

    DIR/rank0/events.out.tfevents.<time>.<host>.<pid>.<random>.kdist   (and rank1/, ...)

Tags: the step-level metrics under their own names (``loss``, ``accuracy``, ``lr``, ...) at
the global step; the epoch-end values as ``epoch_<name>`` (``epoch_val_loss``, ...) at the step
the epoch ended on; ``%tensorboard --logdir DIR`` overlays the ranks.

The format: TFRecord framing (length, masked CRC-32C, data, masked CRC-32C) around
``tensorflow.Event`` protocol buffers with ``simple_value`` summaries, encoded by hand below
(a dozen bytes each; the fields are those of tensorboard/compat/proto/event.proto and
summary.proto).
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
import uuid
from pathlib import Path
from typing import Any, BinaryIO

from .record import RunRecord

#: row fields that are not metrics (as the dashboard's)
NOT_SCALARS = frozenset(
    {
        "rank",
        "epoch",
        "step",
        "batch",
        "fit",
        "time",
        "kind",
        "size",
        "num_steps",
        "step_time",
        "gap_time",
        "batch_size",
    }
)


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _masked(data: bytes) -> int:
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # int64 as protobuf writes it
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:  # a length-delimited field
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def event(
    wall_time: float, step: int, scalars: dict[str, float] | None = None, file_version: str | None = None
) -> bytes:
    """One ``Event``: wall_time (1, double), step (2, int64), file_version (3) or a summary (5)
    of ``Summary.Value``s: tag (1) and simple_value (2, float)."""
    out = b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(int(step))
    if file_version is not None:
        out += _field(3, file_version.encode())
    if scalars:
        values = b"".join(
            _field(1, _field(1, tag.encode()) + b"\x15" + struct.pack("<f", float(v))) for tag, v in scalars.items()
        )
        out += _field(5, values)
    return out


def record_bytes(data: bytes) -> bytes:
    """TFRecord framing of one serialized event."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", _masked(length)) + data + struct.pack("<I", _masked(data))


class EventWriter:
    """One event file; ``add(step, scalars, wall_time)`` appends, ``flush()`` writes out."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        now = time.time()
        # unique per writer: two runs in one second (same kernel, same pid) keep both files
        name = f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}.kdist"
        self.path = self.directory / name
        self._file: BinaryIO = open(self.path, "wb")
        self._file.write(record_bytes(event(now, 0, file_version="brain.Event:2")))

    def add(self, step: int, scalars: dict[str, float], wall_time: float | None = None) -> None:
        if scalars:
            self._file.write(record_bytes(event(wall_time or time.time(), step, scalars)))

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


class RunEvents:
    """Writes a run's metric rows into ``directory/rank<N>/`` as they reach the record."""

    def __init__(self, record: RunRecord, directory: str | os.PathLike, flush_every: float = 2.0):
        self.directory = Path(directory).expanduser()
        self.writers: dict[int, EventWriter] = {}
        self.flush_every = flush_every
        self._flushed = time.time()
        self._lock = threading.Lock()
        self.events = 0
        self.closed = False
        with record._lock:
            for row in list(record.metrics):
                self._write(row)
        record.subscribe(self._on_change)

    def _writer(self, rank: int) -> EventWriter:
        if rank not in self.writers:
            self.writers[rank] = EventWriter(self.directory / f"rank{rank}")
        return self.writers[rank]

    def _write(self, row: dict[str, Any]) -> None:
        step = row.get("step")
        if not isinstance(step, (int, float)):
            return
        epoch = row.get("kind") == "epoch"
        scalars = {
            (f"epoch_{k}" if epoch else k): v
            for k, v in row.items()
            if k not in NOT_SCALARS
            and isinstance(v, (int, float))
            and not isinstance(v, bool)
            and v == v
            and not (k.endswith("_per_s") and epoch)
        }
        with self._lock:
            if self.closed:
                return
            self._writer(int(row.get("rank", 0) or 0)).add(int(step), scalars, row.get("time"))
            self.events += 1
            if time.time() - self._flushed > self.flush_every:
                for w in self.writers.values():
                    w.flush()
                self._flushed = time.time()

    def _on_change(self, kind: str, payload: Any) -> None:
        if kind == "metric":
            self._write(payload)
        elif kind == "status":
            self.close()

    def close(self) -> None:
        with self._lock:
            self.closed = True
            for w in self.writers.values():
                w.close()


def attach(record: RunRecord, directory: str) -> RunEvents:
    return RunEvents(record, directory)
