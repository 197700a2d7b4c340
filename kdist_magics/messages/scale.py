"""The words of ``%kdist scale`` (re-exported by :mod:`kdist_magics.messages`)."""

from __future__ import annotations


def scale_cannot_probe(strategy: str) -> str:
    return (f"%kdist scale probes a cell's training on engines (--strategy horovod or multiworker); "
            f"{strategy} runs in the notebook's kernel, where more ranks are not more processes. "
            f"Nothing ran")


def scale_trained_nothing(what: str) -> str:
    return (f"%kdist scale: the cell {what} (the probe times a few steps of model.fit on each "
            f"rank after 3 warm-up steps: give it a cell that calls fit for at least 6 steps)")


SCALE_NOTHING_TRAINED = ("%kdist scale: no %%kdist cell has trained in this kernel yet; run one, "
                         "or give the probe a cell of its own: %%kdist scale --strategy "
                         "multiworker --np 2")


def scale_quoted(strategy: str, batch: int, cost: float) -> str:
    return (f"measured by %kdist scale ({strategy}, per-rank batch {batch}, {cost:.0f} s; "
            f"kdist_magics.last_scale() has the table):")
