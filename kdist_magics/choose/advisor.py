"""Choosing a strategy: ``--strategy auto`` and ``%kdist advise``.

The seed article's five criteria -- hardware, model size, data size, training
time, set-up cost -- plus what the user wrote on the line, as a table of
:class:`~.rules.Rule` rows (:data:`~.rules.RULES`). Each rule looks at plain *facts* (a dict
built from a :class:`~kdist_magics.hardware.Hardware` description, the
largest Keras model in the namespace and the arrays there), and may rule
strategies out or pick one. The first picking rule whose strategy survives
decides; every rule that applied is a row of the advice table.

Nothing here imports TensorFlow, Keras or JAX: models and data are inspected
only through modules the notebook has already imported (``sys.modules``).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any, Mapping

from . import advice_sharded
from ..errors import StrategyUnavailable
from .facts import facts_for, human
from ..hardware import Hardware, gib
from .rules import RULES, Rule


# -- the decision -------------------------------------------------------------


@dataclass
class Row:
    criterion: str
    observation: str
    consequence: str
    role: str = ""  # "decides", "warning", "" (noted)


@dataclass
class Advice:
    """The whole reasoning: a table of rows, the choice and its one-line reason."""

    strategy: str
    reason: str
    rows: list[Row] = field(default_factory=list)
    hardware: Hardware | None = None
    layout: Any = None  # sharded: the planned layout table (advice_sharded.planned)

    def __repr__(self) -> str:
        import textwrap

        widths = (14, 46, 58)
        head = ("criterion", "observation", "consequence")
        body = [
            (
                r.criterion + (" *" if r.role == "decides" else " !" if r.role == "warning" else ""),
                r.observation,
                r.consequence,
            )
            for r in self.rows
        ]
        out = [f"kdist advise: {self.strategy} -- {self.reason}", ""]
        for cells in [head, tuple("-" * w for w in widths), *body]:
            wrapped = [textwrap.wrap(c, w) or [""] for c, w in zip(cells, widths)]
            for i in range(max(len(w) for w in wrapped)):
                out.append(
                    "  ".join((col[i] if i < len(col) else "").ljust(w) for col, w in zip(wrapped, widths)).rstrip()
                )
        out += ["", "* decides   ! warning"]
        if self.layout is not None:
            out += ["", "planned layout (automatic):", repr(self.layout)]
        return "\n".join(out)

    def _repr_html_(self) -> str:
        esc = html.escape
        mark = {"decides": " *", "warning": " !"}  # as in the text table, and its legend
        rows = "".join(
            f"<tr style='{'font-weight:bold' if r.role == 'decides' else 'color:#b00' if r.role == 'warning' else ''}'>"
            f"<td>{esc(r.criterion + mark.get(r.role, ''))}</td><td>{esc(r.observation)}</td>"
            f"<td>{esc(r.consequence)}</td></tr>"
            for r in self.rows
        )
        return (
            f"<div class='kdist-advice'><p><b>kdist advise: {esc(self.strategy)}</b> &mdash; "
            f"{esc(self.reason)}</p><table><thead><tr><th>criterion</th><th>observation</th>"
            f"<th>consequence</th></tr></thead><tbody>{rows}</tbody></table>"
            f"<p style='color:#666'>* decides &nbsp; ! warning</p>"
            f"{self.layout._repr_html_() if self.layout is not None else ''}</div>"
        )


def decide(f: dict, rules: tuple[Rule, ...] = RULES) -> Advice:
    """Apply ``rules`` to facts ``f``."""
    applied = [r for r in rules if r.when(f)]
    out: set[str] = set()
    for r in applied:
        out.update(r.removed(f))
    rows = [
        Row(r.criterion, r.text("observation", f), r.text("consequence", f), "warning" if r.warn else "")
        for r in applied
    ]
    chosen = deciding = None
    for r, row in zip(applied, rows):
        alive = [s for s in r.pick if s not in out]
        if alive:
            chosen, deciding = alive[0], (r, row)
            break
        if r.pick and r.criterion == "your options" and f["engine_opts"]:
            raise StrategyUnavailable(
                f"{f['engine_opts']} asks for engine ranks, but Keras runs on {f['backend']} and the "
                f"engine strategies need TensorFlow, JAX or torch"
            )
    if deciding is None:  # pragma: no cover - RULES end with a rule that always picks default
        raise StrategyUnavailable("--strategy auto: no rule chose a strategy; give --strategy NAME")
    rule, row = deciding
    row.role = "decides"
    rows.append(Row("backend path", f"Keras on {f['backend']}", backend_path(chosen, f["backend"])))
    parts = [f["hardware"]]
    if f["fits"] is False and chosen != "sharded":
        parts.insert(
            0,
            f"warning: model of {human(f['params'])} parameters needs ~{gib(f['train_bytes'])} "
            f"to train, more than one {f['device_word']}'s {gib(f['device_memory'])}, and every "
            f"strategy copies it to each device: expect out-of-memory (see %kdist advise)",
        )
    elif f["model"] is not None:
        parts.append(f"model of {human(f['params'])} parameters" + (" fits one device" if f["fits"] else ""))
    if rule.criterion in ("your options", "training time"):
        parts.append(row.observation)
    parts.append(rule.reason or row.consequence)
    return Advice(strategy=chosen, reason="; ".join(_dedupe(parts)), rows=rows, hardware=f["hw"])


def backend_path(strategy: str, backend: str) -> str:
    """What ``strategy`` runs the cell with under Keras ``backend`` (``%kdist advise``'s last row)."""
    jax_like = backend == "jax"
    paths = {
        "default": "the cell runs in the kernel as written",
        "mirrored": (
            "keras.distribution.DataParallel over the kernel's devices"
            if jax_like
            else "tf.distribute.MirroredStrategy in the kernel"
        ),
        "tpu": (
            "keras.distribution.DataParallel over the TPU devices"
            if jax_like
            else "tf.distribute.TPUStrategy in the kernel"
        ),
        "horovod": "Horovod ranks on engines (Gloo), with kdist's Keras 3 binding as hvd",
        "sharded": "keras.distribution.ModelParallel over a (batch, model) mesh of the kernel's devices",
        "multiworker": {
            "jax": "one JAX process per engine: jax.distributed, then keras.distribution.DataParallel "
            "over every process's devices",
            "torch": "one torch process per engine: a torch.distributed process group (Gloo; NCCL when "
            "every rank has a GPU), for DistributedDataParallel or kdist's averaged fit",
        }.get(backend, "tf.distribute.MultiWorkerMirroredStrategy, one TensorFlow worker per engine (TF_CONFIG)"),
    }
    return paths.get(strategy, strategy)


def _dedupe(parts):
    seen, out = set(), []
    for p in parts:
        if p and p not in seen:
            seen.add(p)
            out.append(p)
    return out


def hardware_for(magics: Any = None) -> Hardware:
    """This kernel's hardware, with the engines/hosts of a cluster a strategy already holds."""
    from dataclasses import replace

    from ..hardware import detect

    hw = detect()
    for strategy in list(getattr(magics, "_strategies", {}).values()):
        engines = list(getattr(getattr(strategy, "cluster", None), "engines", None) or [])
        hosts = {getattr(e, "hostname", None) for e in engines} - {None}
        if engines and hw.source == "detected":
            return replace(hw, engines=len(engines), hosts=max(hw.hosts, len(hosts)))
    return hw


def advise(user_ns: Mapping[str, Any], spec=None, hardware: Hardware | None = None, **facts) -> Advice:
    """The full reasoning for ``user_ns`` on ``hardware`` (detected when not given)."""
    hw = hardware if hardware is not None else hardware_for()
    f = facts_for(hw, spec, user_ns, **facts)
    advice = decide(f)
    if advice.strategy == "sharded" and advice_sharded.mesh_of(f):
        advice.layout = advice_sharded.planned(user_ns, advice_sharded.mesh_of(f))
    return advice


def choose(user_ns: Mapping[str, Any], spec=None, hardware: Hardware | None = None, **facts) -> tuple[str, str]:
    """``(strategy_name, one_line_reason)`` for ``--strategy auto``."""
    advice = advise(user_ns, spec, hardware, **facts)
    return advice.strategy, advice.reason
