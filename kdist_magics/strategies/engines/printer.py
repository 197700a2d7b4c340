"""The ranks' output in the notebook, as ``--out`` asks: rank 0's, every rank's, or none.

:class:`Printer` is what :class:`~.supervisor.RunSupervisor` writes each rank's stdout and
stderr through, on the kernel's main thread.
"""

from __future__ import annotations

import re
import sys


class Printer:
    """Writes engine output in the kernel: rank 0 only, all ranks prefixed, or nothing.

    With ``all``, output is written a whole line at a time (a line ends at ``\n``
    or at a progress bar's ``\r``), each prefixed ``[rank N]``, so ranks never
    interleave inside a line; :meth:`flush` writes what is left at the end. A progress
    bar's redraw (text after a ``\r``) is shown at once, not held until the next redraw:
    the next one starts with ``\r`` and overwrites it anyway.
    """

    def __init__(self, mode: str):
        self.mode = mode
        self.lead = 0  # whose output "rank0" shows: rank 0, or the first left after losing it
        self.pending: dict[tuple[int, str], str] = {}

    def write(self, rank: int, name: str, text: str) -> None:
        if self.mode == "none" or (self.mode == "rank0" and rank != self.lead):
            return
        if self.mode == "all":
            text = self._lines(rank, name, text)
        if text:
            stream = sys.stderr if name == "stderr" else sys.stdout
            stream.write(text)
            stream.flush()

    def _lines(self, rank: int, name: str, text: str, final: bool = False) -> str:
        buf = self.pending.pop((rank, name), "") + text
        pieces = re.split(r"(?<=[\r\n])", buf)
        rest = "" if final else pieces.pop()
        if rest and pieces and pieces[-1].endswith("\r"):  # a progress bar's redraw: show it now
            pieces.append(rest)
            rest = ""
        if rest:
            self.pending[(rank, name)] = rest
        tag = f"[rank {rank}] "
        return "".join(p if p in ("\r", "\n") else tag + p for p in pieces if p)

    def flush(self) -> None:
        for rank, name in list(self.pending):
            text = self._lines(rank, name, "", final=True)
            stream = sys.stderr if name == "stderr" else sys.stdout
            stream.write(text + ("" if text.endswith(("\n", "\r")) else "\n"))
            stream.flush()
