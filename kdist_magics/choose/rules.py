"""The decision table behind ``--strategy auto`` and ``%kdist advise``: the seed article's
criteria (hardware, model size, data size, training time, set-up cost) and what the user wrote
on the line, as :class:`Rule` rows (:data:`RULES`), first to last. :mod:`.advisor` applies them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import advice_sharded
from ..spec import ENGINE_STRATEGIES, KERNEL_STRATEGIES, KINDS
from .facts import BIG_DATA_BYTES, ENGINE_SETUP_S, SMALL_EPOCH_S, data_words, human_seconds, model_words
from ..hardware import TPU_PLACES, gib

CANDIDATES = tuple(KINDS)  # in the order auto prefers them when nothing else decides
ENGINE = ENGINE_STRATEGIES
KERNEL = KERNEL_STRATEGIES
#: Keras backends whose multiworker runs one framework process per engine
PROCESS_BACKENDS = ("jax", "torch")


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
    Rule(
        "your options",
        lambda f: f.get("mesh") is not None,
        lambda f: f"--mesh {f['mesh'][0]},{f['mesh'][1]} given",
        "a device mesh, which only sharded takes: sharded",
        pick=("sharded",),
        doc="`--mesh D,M` given: sharded",
    ),
    Rule(
        "your options",
        lambda f: f["devices_given"],
        "--devices {devices} given",
        "an in-kernel strategy with {devices} replicas: mirrored",
        pick=("mirrored",),
        doc="`--devices N` given: mirrored",
    ),
    Rule(
        "your options",
        lambda f: f["min_np"] is not None,
        "--min-np {min_np} given",
        "an elastic run, which only Horovod has: horovod",
        pick=("horovod",),
        doc="`--min-np K` given (an elastic run): horovod",
    ),
    Rule(
        "your options",
        lambda f: bool(f["engine_opts"]),
        "{engine_opts} given",
        "an engine strategy: horovod if importable, else multiworker",
        pick=ENGINE,
        rule_out=KERNEL,
        doc="`--np`, `--push`/`--pull` or `--cluster-id`/`--profile` given: an engine strategy (horovod where Horovod is importable, else multiworker); the in-kernel ones are ruled out",
    ),
    # hardware
    Rule(
        "hardware",
        lambda f: f["tpu"] and f["hw"].tpu.cores == 1 and f["backend"] == "jax",
        lambda f: f"{f['hardware']}, found by {f['hw'].tpu.found_by or 'description'}",
        "one TPU device (Colab's v5e-1): data parallelism over one device gains nothing, and "
        "Keras on JAX already runs the cell on the chip: default",
        pick=("default",),
        rule_out=("tpu", "mirrored"),
        doc="one TPU chip (Colab's v5e-1, v6e-1) under Keras on JAX: default, JAX already runs the cell on the chip; tpu and mirrored are ruled out",
    ),
    Rule(
        "hardware",
        lambda f: f["tpu"] and f["hw"].tpu.cores == 1 and f["backend"] != "jax",
        lambda f: f"{f['hardware']}, found by {f['hw'].tpu.found_by or 'description'}",
        "one TPU device: TPUStrategy with a single replica only places the cell on the chip "
        "(TensorFlow uses a TPU only through it); no data parallelism",
        pick=("tpu",),
        doc="one TPU chip on another backend: tpu, a single replica",
    ),
    Rule(
        "hardware",
        lambda f: f["tpu"] and f["hw"].tpu.cores > 1,
        lambda f: f"{f['hardware']}, found by {f['hw'].tpu.found_by or 'description'}",
        lambda f: (
            f"TPUStrategy replicates the model on every {f['hw'].tpu.unit}; the fastest path for large models and data"
            if f["backend"] != "jax"
            else f"keras.distribution.DataParallel over the {f['hw'].tpu.cores} TPU devices; "
            "the fastest path for large models and data"
        ),
        pick=("tpu",),
        doc="a TPU of several chips (Kaggle's v5e-8): tpu",
    ),
    Rule(
        "hardware",
        lambda f: not f["tpu"],
        f"no TPU (looked for {TPU_PLACES})",
        "tpu is ruled out",
        rule_out=("tpu",),
        doc="no TPU: tpu is ruled out",
    ),
    Rule(
        "hardware",
        lambda f: f["gpus"] == 0 and not f["tpu"] and not f["devices_given"],
        "{hardware}",
        "one compute device (TF already uses every core); mirrored on logical CPU devices "
        "demonstrates data parallelism but does not speed training up",
        rule_out=("mirrored",),
        doc="no GPU (and no `--devices`): mirrored is ruled out, there is one compute device",
    ),
    Rule(
        "hardware",
        lambda f: f["gpus"] == 1 and not f["tpu"] and not f["devices_given"],
        "{hardware}",
        "one device: mirrored would have a single replica and add nothing",
        rule_out=("mirrored",),
        doc="one GPU: mirrored is ruled out",
    ),
    Rule(
        "hardware",
        lambda f: f["gpus"] > 1 and f["backend"] in PROCESS_BACKENDS and not f["tpu"],
        "{gpus} GPUs on this host, Keras on {backend}",
        lambda f: (
            f"one {f['backend']} process per GPU (multiworker): each rank sees its own GPU, "
            f"the way {'JAX' if f['backend'] == 'jax' else 'PyTorch'} trains on several GPUs"
        ),
        pick=("multiworker",),
        doc="several GPUs on one host under Keras on JAX or torch: multiworker, one process per GPU",
    ),
    Rule(
        "hardware",
        lambda f: (
            f["hosts"] == 1
            and not f["engine_opts"]
            and not (f["gpus"] > 1 and f["backend"] in PROCESS_BACKENDS and not f["tpu"])
        ),
        lambda f: "one host" + (f", {f['engines']} engines" if f["engines"] else ", no cluster attached"),
        "engine strategies (horovod, multiworker) are for several hosts here; "
        "one host's devices are used in the kernel",
        rule_out=ENGINE,
        doc="one host and no engine options: the engine strategies are ruled out (but for several GPUs under JAX or torch)",
    ),
    Rule(
        "hardware",
        lambda f: not f["horovod"],
        "Horovod is not importable in this kernel",
        "horovod is ruled out (multiworker is the engine strategy then)",
        rule_out=("horovod",),
        doc="Horovod not importable: horovod is ruled out",
    ),
    Rule(
        "hardware",
        lambda f: f["backend"] != "tensorflow",
        "Keras backend is {backend}",
        lambda f: (
            "horovod drives TensorFlow; multiworker runs one JAX process per engine, "
            "mirrored and tpu use keras.distribution.DataParallel in the kernel"
            if f["backend"] == "jax"
            else "horovod, mirrored and tpu drive TensorFlow or JAX; multiworker runs one torch "
            "process per engine (torch.distributed)"
            if f["backend"] == "torch"
            else "kdist's strategies drive TensorFlow, JAX or torch: only default fits"
        ),
        rule_out=lambda f: (
            ("horovod",)
            if f["backend"] == "jax"
            else ("horovod", "mirrored", "tpu")
            if f["backend"] == "torch"
            else ENGINE + ("mirrored", "tpu")
        ),
        doc="Keras on JAX rules horovod out (multiworker runs JAX processes); on torch horovod, mirrored and tpu (multiworker runs torch processes); on any other backend all but default",
    ),
    # model size
    Rule(
        "model size",
        advice_sharded.applies,
        advice_sharded.observation,
        advice_sharded.words,
        pick=("sharded",),
        rule_out=advice_sharded.rule_out,
        doc="the model (weights x 4: weights, gradients, two Adam moments) does not fit one device, Keras on JAX with several devices: sharded, the model split over a mesh",
    ),
    Rule(
        "model size",
        lambda f: f["fits"] is False and not advice_sharded.applies(f),
        lambda f: f"{model_words(f)}, more than one {f['device_word']}'s {gib(f['device_memory'])}",
        "every strategy here keeps a full copy of the model per device, so expect out-of-memory: "
        "shrink the model, use mixed precision, or shard it (keras.distribution.ModelParallel with JAX)",
        warn=True,
        doc="the model does not fit one device otherwise: a warning leads the reason, since every data-parallel strategy keeps a full copy per device (shrink it, mixed precision, or JAX and sharded)",
    ),
    Rule(
        "model size",
        lambda f: f["fits"] is True,
        lambda f: f"{model_words(f)}",
        lambda f: f"fits one {f['device_word']} ({gib(f['device_memory'])}), so data parallelism applies",
        doc="the model fits one device: data parallelism applies (noted)",
    ),
    Rule(
        "model size",
        lambda f: f["fits"] is None,
        model_words,
        lambda f: (
            "judged on hardware alone; build the model first for a sharper choice"
            if f["model"] is None
            else "one device's memory is unknown, so fit is not judged"
        ),
        doc="no built model in the namespace, or one device's memory unknown: judged on hardware alone (noted)",
    ),
    # data size
    Rule(
        "data size",
        lambda f: f["data"] is not None,
        data_words,
        lambda f: (
            "large data: more devices shorten each epoch"
            if f["data_bytes"] >= BIG_DATA_BYTES
            else "small data: on its own it does not call for more devices"
        ),
        doc="arrays and datasets in the namespace: 1 GB or more is large data, which favours more devices; less does not call for them on its own (noted)",
    ),
    # training time
    Rule(
        "training time",
        lambda f: f["small_job"],
        lambda f: f"one epoch {human_seconds(f['epoch_s'])} on one device (rough estimate)",
        f"too short to repay the set-up: horovod's ~{ENGINE_SETUP_S:.0f} s engine set-up and "
        "per-step all-reduce are not worth it for a small job",
        pick=("default",),
        doc="one epoch under ~10 s on one device (~6 x parameters x samples FLOPs at a rough device rate): default, engine set-up and per-step all-reduce are not repaid",
    ),
    Rule(
        "training time",
        lambda f: f["epoch_s"] is not None and not f["small_job"],
        lambda f: f"one epoch {human_seconds(f['epoch_s'])} on one device (rough estimate)",
        lambda f: (
            "long enough that more devices pay off"
            if f["epoch_s"] >= SMALL_EPOCH_S
            else "short, but the model or the data is large (above), so it is not judged small"
        ),
        doc="one epoch of 10 s or more: long enough that more devices may pay off (noted)",
    ),
    Rule(
        "hardware",
        lambda f: f["hosts"] > 1,
        lambda f: f"{f['hardware']}, {f['engines'] or 'no'} engines attached",
        "mirrored stops at one box; horovod's ring-allreduce spans the hosts",
        pick=ENGINE,
        doc="several hosts: an engine strategy, horovod's ring-allreduce spans the hosts",
    ),
    Rule(
        "hardware",
        lambda f: f["gpus"] > 1,
        "{gpus} GPUs on this host",
        "mirrored replicates the model on each GPU and splits every batch, with no engine set-up",
        pick=("mirrored",),
        doc="several GPUs on one host: mirrored",
    ),
    # set-up cost
    Rule(
        "set-up cost",
        lambda f: True,
        "in-kernel default: no set-up; engines: ~10 s to start; TPU: connect once per kernel",
        "when no rule above decides: default, the cell as it is in the notebook",
        pick=("default",),
        reason="default runs the cell as it is, with no set-up",
        doc="otherwise: default, the cell as it is in the notebook",
    ),
)
