"""Choosing a strategy: ``--strategy auto`` and ``%kdist advise``.

The seed article's five criteria -- hardware, model size, data size, training
time, set-up cost -- plus what the user wrote on the line, as a table of
:class:`Rule` rows (:data:`RULES`). Each rule looks at plain *facts* (a dict
built from a :class:`~kdist_magics.choose.hardware.Hardware` description, the
largest Keras model in the namespace and the arrays there), and may rule
strategies out or pick one. The first picking rule whose strategy survives
decides; every rule that applied is a row of the advice table.

Nothing here imports TensorFlow, Keras or JAX: models and data are inspected
only through modules the notebook has already imported (``sys.modules``).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from . import advice_sharded
from ..errors import StrategyUnavailable
from .facts import (
    BIG_DATA_BYTES,
    ENGINE_SETUP_S,
    SMALL_EPOCH_S,
    data_words,
    facts_for,
    human,
    human_seconds,
    model_words,
)
from .hardware import TPU_PLACES, Hardware, gib
from ..spec import ENGINE_STRATEGIES, KERNEL_STRATEGIES, KINDS

CANDIDATES = tuple(KINDS)  # in the order auto prefers them when nothing else decides
ENGINE = ENGINE_STRATEGIES
KERNEL = KERNEL_STRATEGIES
#: Keras backends whose multiworker runs one framework process per engine
PROCESS_BACKENDS = ("jax", "torch")

# -- the rules ----------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One row of the decision table.

    ``when(facts)`` says whether the rule applies; ``observation`` and
    ``consequence`` are format strings (or callables) over the facts;
    ``rule_out`` removes strategies from the candidates; ``pick`` lists the
    strategies this rule would choose, best first; ``warn`` rules lead the
    one-line reason.
    """

    criterion: str
    when: Callable[[dict], bool]
    observation: str | Callable[[dict], str]
    consequence: str | Callable[[dict], str]
    pick: tuple[str, ...] = ()
    rule_out: tuple[str, ...] | Callable[[dict], tuple[str, ...]] = ()
    warn: bool = False
    #: words for the one-line reason when this rule decides (default: the consequence)
    reason: str = ""
    #: the rule in one line, as the choosing guide's table shows it (generated from here)
    doc: str = ""

    def text(self, which: str, f: dict) -> str:
        value = getattr(self, which)
        return value(f) if callable(value) else value.format(**f)

    def removed(self, f: dict) -> tuple[str, ...]:
        return self.rule_out(f) if callable(self.rule_out) else self.rule_out


RULES: tuple[Rule, ...] = (
    # what the user wrote decides first
    Rule("your options", lambda f: f.get("mesh") is not None,
         lambda f: f"--mesh {f['mesh'][0]},{f['mesh'][1]} given",
         "a device mesh, which only sharded takes: sharded",
         pick=("sharded",),
         doc="`--mesh D,M` given: sharded"),
    Rule("your options", lambda f: f["devices_given"],
         "--devices {devices} given",
         "an in-kernel strategy with {devices} replicas: mirrored",
         pick=("mirrored",),
         doc="`--devices N` given: mirrored"),
    Rule("your options", lambda f: f["min_np"] is not None,
         "--min-np {min_np} given",
         "an elastic run, which only Horovod has: horovod",
         pick=("horovod",),
         doc="`--min-np K` given (an elastic run): horovod"),
    Rule("your options", lambda f: bool(f["engine_opts"]),
         "{engine_opts} given",
         "an engine strategy: horovod if importable, else multiworker",
         pick=ENGINE, rule_out=KERNEL,
         doc="`--np`, `--push`/`--pull` or `--cluster-id`/`--profile` given: an engine strategy (horovod where Horovod is importable, else multiworker); the in-kernel ones are ruled out"),
    # hardware
    Rule("hardware", lambda f: f["tpu"] and f["hw"].tpu.cores == 1 and f["backend"] == "jax",
         lambda f: f"{f['hardware']}, found by {f['hw'].tpu.found_by or 'description'}",
         "one TPU device (Colab's v5e-1): data parallelism over one device gains nothing, and "
         "Keras on JAX already runs the cell on the chip: default",
         pick=("default",), rule_out=("tpu", "mirrored"),
         doc="one TPU chip (Colab's v5e-1, v6e-1) under Keras on JAX: default, JAX already runs the cell on the chip; tpu and mirrored are ruled out"),
    Rule("hardware", lambda f: f["tpu"] and f["hw"].tpu.cores == 1 and f["backend"] != "jax",
         lambda f: f"{f['hardware']}, found by {f['hw'].tpu.found_by or 'description'}",
         "one TPU device: TPUStrategy with a single replica only places the cell on the chip "
         "(TensorFlow uses a TPU only through it); no data parallelism",
         pick=("tpu",),
         doc="one TPU chip on another backend: tpu, a single replica"),
    Rule("hardware", lambda f: f["tpu"] and f["hw"].tpu.cores > 1,
         lambda f: f"{f['hardware']}, found by {f['hw'].tpu.found_by or 'description'}",
         lambda f: (f"TPUStrategy replicates the model on every {f['hw'].tpu.unit}; the fastest "
                    "path for large models and data" if f["backend"] != "jax" else
                    f"keras.distribution.DataParallel over the {f['hw'].tpu.cores} TPU devices; "
                    "the fastest path for large models and data"),
         pick=("tpu",),
         doc="a TPU of several chips (Kaggle's v5e-8): tpu"),
    Rule("hardware", lambda f: not f["tpu"],
         f"no TPU (looked for {TPU_PLACES})",
         "tpu is ruled out", rule_out=("tpu",),
         doc="no TPU: tpu is ruled out"),
    Rule("hardware", lambda f: f["gpus"] == 0 and not f["tpu"] and not f["devices_given"],
         "{hardware}",
         "one compute device (TF already uses every core); mirrored on logical CPU devices "
         "demonstrates data parallelism but does not speed training up",
         rule_out=("mirrored",),
         doc="no GPU (and no `--devices`): mirrored is ruled out, there is one compute device"),
    Rule("hardware", lambda f: f["gpus"] == 1 and not f["tpu"] and not f["devices_given"],
         "{hardware}",
         "one device: mirrored would have a single replica and add nothing",
         rule_out=("mirrored",),
         doc="one GPU: mirrored is ruled out"),
    Rule("hardware", lambda f: f["gpus"] > 1 and f["backend"] in PROCESS_BACKENDS and not f["tpu"],
         "{gpus} GPUs on this host, Keras on {backend}",
         lambda f: (f"one {f['backend']} process per GPU (multiworker): each rank sees its own GPU, "
                    f"the way {'JAX' if f['backend'] == 'jax' else 'PyTorch'} trains on several GPUs"),
         pick=("multiworker",),
         doc="several GPUs on one host under Keras on JAX or torch: multiworker, one process per GPU"),
    Rule("hardware", lambda f: f["hosts"] == 1 and not f["engine_opts"]
         and not (f["gpus"] > 1 and f["backend"] in PROCESS_BACKENDS and not f["tpu"]),
         lambda f: "one host" + (f", {f['engines']} engines" if f["engines"] else ", no cluster attached"),
         "engine strategies (horovod, multiworker) are for several hosts here; "
         "one host's devices are used in the kernel",
         rule_out=ENGINE,
         doc="one host and no engine options: the engine strategies are ruled out (but for several GPUs under JAX or torch)"),
    Rule("hardware", lambda f: not f["horovod"],
         "Horovod is not importable in this kernel",
         "horovod is ruled out (multiworker is the engine strategy then)",
         rule_out=("horovod",),
         doc="Horovod not importable: horovod is ruled out"),
    Rule("hardware", lambda f: f["backend"] != "tensorflow",
         "Keras backend is {backend}",
         lambda f: ("horovod drives TensorFlow; multiworker runs one JAX process per engine, "
                    "mirrored and tpu use keras.distribution.DataParallel in the kernel"
                    if f["backend"] == "jax" else
                    "horovod, mirrored and tpu drive TensorFlow or JAX; multiworker runs one torch "
                    "process per engine (torch.distributed)"
                    if f["backend"] == "torch" else
                    "kdist's strategies drive TensorFlow, JAX or torch: only default fits"),
         rule_out=lambda f: (("horovod",) if f["backend"] == "jax" else
                             ("horovod", "mirrored", "tpu") if f["backend"] == "torch" else
                             ENGINE + ("mirrored", "tpu")),
         doc="Keras on JAX rules horovod out (multiworker runs JAX processes); on torch horovod, mirrored and tpu (multiworker runs torch processes); on any other backend all but default"),
    # model size
    Rule("model size", advice_sharded.applies, advice_sharded.observation, advice_sharded.words,
         pick=("sharded",), rule_out=advice_sharded.rule_out,
         doc="the model (weights x 4: weights, gradients, two Adam moments) does not fit one device, Keras on JAX with several devices: sharded, the model split over a mesh"),
    Rule("model size", lambda f: f["fits"] is False and not advice_sharded.applies(f),
         lambda f: f"{model_words(f)}, more than one {f['device_word']}'s {gib(f['device_memory'])}",
         "every strategy here keeps a full copy of the model per device, so expect out-of-memory: "
         "shrink the model, use mixed precision, or shard it (keras.distribution.ModelParallel with JAX)",
         warn=True,
         doc="the model does not fit one device otherwise: a warning leads the reason, since every data-parallel strategy keeps a full copy per device (shrink it, mixed precision, or JAX and sharded)"),
    Rule("model size", lambda f: f["fits"] is True,
         lambda f: f"{model_words(f)}",
         lambda f: f"fits one {f['device_word']} ({gib(f['device_memory'])}), so data parallelism applies",
         doc="the model fits one device: data parallelism applies (noted)"),
    Rule("model size", lambda f: f["fits"] is None,
         model_words,
         lambda f: ("judged on hardware alone; build the model first for a sharper choice"
                    if f["model"] is None else "one device's memory is unknown, so fit is not judged"),
         doc="no built model in the namespace, or one device's memory unknown: judged on hardware alone (noted)"),
    # data size
    Rule("data size", lambda f: f["data"] is not None,
         data_words,
         lambda f: ("large data: more devices shorten each epoch" if f["data_bytes"] >= BIG_DATA_BYTES
                    else "small data: on its own it does not call for more devices"),
         doc="arrays and datasets in the namespace: 1 GB or more is large data, which favours more devices; less does not call for them on its own (noted)"),
    # training time
    Rule("training time", lambda f: f["small_job"],
         lambda f: f"one epoch {human_seconds(f['epoch_s'])} on one device (rough estimate)",
         f"too short to repay the set-up: horovod's ~{ENGINE_SETUP_S:.0f} s engine set-up and "
         "per-step all-reduce are not worth it for a small job",
         pick=("default",),
         doc="one epoch under ~10 s on one device (~6 x parameters x samples FLOPs at a rough device rate): default, engine set-up and per-step all-reduce are not repaid"),
    Rule("training time", lambda f: f["epoch_s"] is not None and not f["small_job"],
         lambda f: f"one epoch {human_seconds(f['epoch_s'])} on one device (rough estimate)",
         lambda f: ("long enough that more devices pay off" if f["epoch_s"] >= SMALL_EPOCH_S else
                    "short, but the model or the data is large (above), so it is not judged small"),
         doc="one epoch of 10 s or more: long enough that more devices may pay off (noted)"),
    Rule("hardware", lambda f: f["hosts"] > 1,
         lambda f: f"{f['hardware']}, {f['engines'] or 'no'} engines attached",
         "mirrored stops at one box; horovod's ring-allreduce spans the hosts",
         pick=ENGINE,
         doc="several hosts: an engine strategy, horovod's ring-allreduce spans the hosts"),
    Rule("hardware", lambda f: f["gpus"] > 1,
         "{gpus} GPUs on this host",
         "mirrored replicates the model on each GPU and splits every batch, with no engine set-up",
         pick=("mirrored",),
         doc="several GPUs on one host: mirrored"),
    # set-up cost
    Rule("set-up cost", lambda f: True,
         "in-kernel default: no set-up; engines: ~10 s to start; TPU: connect once per kernel",
         "when no rule above decides: default, the cell as it is in the notebook",
         pick=("default",), reason="default runs the cell as it is, with no set-up",
         doc="otherwise: default, the cell as it is in the notebook"),
)


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
        body = [(r.criterion + (" *" if r.role == "decides" else " !" if r.role == "warning" else ""),
                 r.observation, r.consequence) for r in self.rows]
        out = [f"kdist advise: {self.strategy} -- {self.reason}", ""]
        for cells in [head, tuple("-" * w for w in widths), *body]:
            wrapped = [textwrap.wrap(c, w) or [""] for c, w in zip(cells, widths)]
            for i in range(max(len(w) for w in wrapped)):
                out.append("  ".join((col[i] if i < len(col) else "").ljust(w)
                                     for col, w in zip(wrapped, widths)).rstrip())
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
            for r in self.rows)
        return (f"<div class='kdist-advice'><p><b>kdist advise: {esc(self.strategy)}</b> &mdash; "
                f"{esc(self.reason)}</p><table><thead><tr><th>criterion</th><th>observation</th>"
                f"<th>consequence</th></tr></thead><tbody>{rows}</tbody></table>"
                f"<p style='color:#666'>* decides &nbsp; ! warning</p>"
                f"{self.layout._repr_html_() if self.layout is not None else ''}</div>")


def decide(f: dict, rules: tuple[Rule, ...] = RULES) -> Advice:
    """Apply ``rules`` to facts ``f``."""
    applied = [r for r in rules if r.when(f)]
    out: set[str] = set()
    for r in applied:
        out.update(r.removed(f))
    rows = [Row(r.criterion, r.text("observation", f), r.text("consequence", f),
                "warning" if r.warn else "") for r in applied]
    chosen = deciding = None
    for r, row in zip(applied, rows):
        alive = [s for s in r.pick if s not in out]
        if alive:
            chosen, deciding = alive[0], (r, row)
            break
        if r.pick and r.criterion == "your options" and f["engine_opts"]:
            raise StrategyUnavailable(
                f"{f['engine_opts']} asks for engine ranks, but Keras runs on {f['backend']} and the "
                f"engine strategies need TensorFlow, JAX or torch")
    if deciding is None:  # pragma: no cover - RULES end with a rule that always picks default
        raise StrategyUnavailable("--strategy auto: no rule chose a strategy; give --strategy NAME")
    rule, row = deciding
    row.role = "decides"
    rows.append(Row("backend path", f"Keras on {f['backend']}", backend_path(chosen, f["backend"])))
    parts = [f["hardware"]]
    if f["fits"] is False and chosen != "sharded":
        parts.insert(0, f"warning: model of {human(f['params'])} parameters needs ~{gib(f['train_bytes'])} "
                        f"to train, more than one {f['device_word']}'s {gib(f['device_memory'])}, and every "
                        f"strategy copies it to each device: expect out-of-memory (see %kdist advise)")
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
        "mirrored": ("keras.distribution.DataParallel over the kernel's devices" if jax_like
                     else "tf.distribute.MirroredStrategy in the kernel"),
        "tpu": ("keras.distribution.DataParallel over the TPU devices" if jax_like
                else "tf.distribute.TPUStrategy in the kernel"),
        "horovod": "Horovod ranks on engines (Gloo), with kdist's Keras 3 binding as hvd",
        "sharded": "keras.distribution.ModelParallel over a (batch, model) mesh of the kernel's devices",
        "multiworker": {
            "jax": "one JAX process per engine: jax.distributed, then keras.distribution.DataParallel "
                   "over every process's devices",
            "torch": "one torch process per engine: a torch.distributed process group (Gloo; NCCL when "
                     "every rank has a GPU), for DistributedDataParallel or kdist's averaged fit",
        }.get(backend, "tf.distribute.MultiWorkerMirroredStrategy, one TensorFlow worker per engine "
                       "(TF_CONFIG)"),
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

    from .hardware import detect

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


def choose(user_ns: Mapping[str, Any], spec=None, hardware: Hardware | None = None,
           **facts) -> tuple[str, str]:
    """``(strategy_name, one_line_reason)`` for ``--strategy auto``."""
    advice = advise(user_ns, spec, hardware, **facts)
    return advice.strategy, advice.reason
