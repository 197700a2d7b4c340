"""Fast tier: --strategy tpu without a TPU, and the connect-once path with a fake runtime.

No TensorFlow is imported: without a TPU the run stops before TF, and the fake
runtime stands in for TPUClusterResolver / initialize_tpu_system / TPUStrategy.
"""

import contextlib
import subprocess
import sys

import pytest

import kdist_magics
from kdist_magics.errors import StrategyUnavailable
from kdist_magics.hardware import TPU, tpu_from_kind
from kdist_magics.strategies.kernel.tpu import TPUStrategy


def test_no_tpu_fails_fast_and_clearly_in_a_fresh_kernel():
    code = (
        "import sys\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "ip = InteractiveShell.instance()\n"
        "ip.run_line_magic('load_ext', 'kdist_magics')\n"
        "ip.user_ns['marker'] = 'before'\n"
        "try:\n"
        "    ip.run_cell_magic('kdist', '--strategy tpu --no-dashboard', 'marker = \"ran\"')\n"
        "except Exception as exc:\n"
        "    print('RENDERED', repr(''.join(exc._render_traceback_())))\n"
        "    print('TYPE', type(exc).__name__)\n"
        "print('MARKER', ip.user_ns['marker'])\n"
        "print('TF', 'tensorflow' in sys.modules)\n"
    )
    env = {
        k: v
        for k, v in __import__("os").environ.items()
        if k not in ("COLAB_TPU_ADDR", "TPU_NAME", "TPU_ACCELERATOR_TYPE", "KDIST_HARDWARE")
    }
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    lines = dict(l.split(" ", 1) for l in out.stdout.splitlines() if " " in l)
    assert lines["TYPE"] == "StrategyUnavailable"
    rendered = eval(lines["RENDERED"])
    assert len(rendered.splitlines()) <= 3
    for words in (
        "no TPU found",
        "COLAB_TPU_ADDR",
        "TPU_NAME",
        "/dev/accel",
        "/dev/vfio",
        "Runtime > Change runtime type > TPU",
        "Kaggle",
        "Accelerator > TPU",
        "did not run",
    ):
        assert words in rendered, words
    assert lines["MARKER"] == "before"  # the cell did not run
    assert lines["TF"] == "False"  # failed before importing TensorFlow


def test_no_tpu_in_this_shell(ip):
    ip.user_ns["marker"] = "before"
    ext = kdist_magics._extension
    ext._strategies["tpu"] = TPUStrategy(find=lambda: None)
    with pytest.raises(StrategyUnavailable) as info:
        ip.run_cell_magic("kdist", "--strategy tpu --no-dashboard", "marker = 'ran'")
    assert len(str(info.value).splitlines()) == 3
    assert ip.user_ns["marker"] == "before"
    rec = kdist_magics.last_run()
    assert rec.strategy == "tpu" and rec.status == "not run"  # (its dashboard: none left)
    ext._strategies.pop("tpu")


class FakeStrategy:
    num_replicas_in_sync = 8

    def __init__(self, resolver):
        self.resolver = resolver
        self.entered = 0

    @contextlib.contextmanager
    def scope(self):
        self.entered += 1
        yield self


class FakeRuntime:
    """Records what a real TPURuntime would do."""

    def __init__(self, fail: Exception | None = None):
        self.calls = []
        self.fail = fail

    def resolver(self, target):
        self.calls.append(("resolve", target))
        if self.fail:
            raise self.fail
        return {"target": target}

    def initialize(self, resolver, target):
        self.calls.append(("initialize", target))

    def strategy(self, resolver):
        self.calls.append(("strategy", resolver["target"]))
        return FakeStrategy(resolver)


@pytest.fixture
def fake_tpu(ip):
    ext = kdist_magics._extension
    runtime, cache = FakeRuntime(), {}
    found = tpu_from_kind("v2-8", target="local", found_by="/dev/accel0")
    ext._strategies["tpu"] = TPUStrategy(runtime=runtime, find=lambda: found, cache=cache)
    yield ext, runtime, cache
    ext._strategies.pop("tpu", None)


def test_connects_once_and_reuses(ip, fake_tpu):
    ext, runtime, cache = fake_tpu
    ip.run_cell_magic(
        "kdist",
        "--strategy tpu --no-dashboard --no-telemetry",
        "first = strategy\nreplicas = strategy.num_replicas_in_sync",
    )
    ip.run_cell_magic("kdist", "--strategy tpu --no-dashboard --no-telemetry", "second = strategy")
    ns = ip.user_ns
    assert ns["replicas"] == 8 and ns["first"] is ns["second"] is ns["strategy"]
    assert ns["first"].entered == 2  # each cell ran inside the strategy's scope
    assert runtime.calls == [("resolve", "local"), ("initialize", "local"), ("strategy", "local")]
    rec = kdist_magics.last_run()
    assert rec.strategy == "tpu" and rec.status == "done" and len(rec.ranks) == 8
    assert {s.state for s in rec.ranks.values()} == {"done"}
    assert ext._strategies["tpu"].status() == {"tpu": "v2-8", "target": "local", "replicas": 8}
    # what %kdist restart does to it (teardown, a new object later); the TPU connection is kept.
    # (Not %kdist restart itself: it would also stop engines other tests in this session hold.)
    ext._strategies.pop("tpu").teardown()
    ext._strategies["tpu"] = TPUStrategy(runtime=runtime, find=lambda: tpu_from_kind("v2-8"), cache=cache)
    ip.run_cell_magic("kdist", "--strategy tpu --no-dashboard --no-telemetry", "third = strategy")
    assert ns["third"] is ns["first"] and len(runtime.calls) == 3


def test_address_based_runtime_is_resolved_by_address(ip):
    runtime = FakeRuntime()
    node = TPU(kind="v2-8", cores=8, target="grpc://10.0.0.2:8470", found_by="COLAB_TPU_ADDR")
    strategy = TPUStrategy(runtime=runtime, find=lambda: node, cache={})
    kdist_magics._extension._strategies["tpu"] = strategy
    try:
        ip.run_cell_magic("kdist", "-s tpu --no-dashboard --no-telemetry", "pass")
    finally:
        kdist_magics._extension._strategies.pop("tpu")
    assert runtime.calls[:2] == [("resolve", "grpc://10.0.0.2:8470"), ("initialize", "grpc://10.0.0.2:8470")]


def test_a_failed_connection_is_short_and_runs_nothing(ip):
    runtime = FakeRuntime(fail=ValueError("Please provide a TPU Name to connect to.\nmore internals"))
    found = TPU(kind="tpu", target="my-tpu", found_by="TPU_NAME")
    kdist_magics._extension._strategies["tpu"] = TPUStrategy(runtime=runtime, find=lambda: found, cache={})
    ip.user_ns["marker"] = "before"
    try:
        with pytest.raises(StrategyUnavailable) as info:
            ip.run_cell_magic("kdist", "-s tpu --no-dashboard", "marker = 'ran'")
    finally:
        kdist_magics._extension._strategies.pop("tpu")
    message = str(info.value)
    assert len(message.splitlines()) == 3
    assert "TPU_NAME -> my-tpu" in message and "ValueError: Please provide a TPU Name" in message
    assert "more internals" not in message and "Change runtime type" in message
    assert ip.user_ns["marker"] == "before"


def test_the_users_error_is_theirs(ip, fake_tpu, capsys):
    from kdist_magics.errors import CellFailed

    with pytest.raises(CellFailed) as info:
        ip.run_cell_magic("kdist", "-s tpu --no-dashboard --no-telemetry", "raise KeyError('labels')")
    assert isinstance(info.value.original, KeyError)
    out = capsys.readouterr()
    assert "labels" in out.out + out.err
    assert kdist_magics.last_run().status == "failed"


def test_a_backend_kdist_cannot_drive_is_refused(ip, fake_tpu, monkeypatch):
    ext, runtime, cache = fake_tpu
    monkeypatch.setattr("kdist_magics.strategies.frameworks.backends.keras_backend", lambda env=None: "torch")
    ip.user_ns["marker"] = "before"
    for name in ("tpu", "mirrored"):
        with pytest.raises(StrategyUnavailable) as info:
            ip.run_cell_magic("kdist", f"-s {name} --no-dashboard", "marker = 'ran'")
        assert "runs on torch" in str(info.value) and "did not run" in str(info.value)
    assert ip.user_ns["marker"] == "before" and runtime.calls == []


def test_an_address_that_does_not_answer_fails_fast_without_tensorflow():
    """The real runtime checks a grpc:// address before TF would wait on it."""
    import socket

    with socket.socket() as s:  # a loopback port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (
        "import sys\n"
        "from kdist_magics.hardware import TPU\n"
        "from kdist_magics.strategies.frameworks.on_tf import TPURuntime\nfrom kdist_magics.strategies.kernel.tpu import connect\n"
        f"node = TPU(kind='v2-8', target='grpc://127.0.0.1:{port}', found_by='COLAB_TPU_ADDR')\n"
        "try:\n"
        "    connect(node, TPURuntime(), {})\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__); print(exc)\n"
        "print('TF', 'tensorflow' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "StrategyUnavailable" and len(lines) == 5
    assert f"COLAB_TPU_ADDR -> grpc://127.0.0.1:{port}" in lines[1] and "does not answer" in lines[1]
    assert "Change runtime type" in lines[2] and lines[3] == "The cell did not run."
    assert lines[4] == "TF False"


@pytest.mark.quick
@pytest.mark.kernel
@pytest.mark.timeout(300)
def test_real_tensorflow_on_a_machine_without_tpu_fails_short():
    """TPUClusterResolver('local') + initialize_tpu_system with real TF, where no TPU is."""
    code = (
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "from kdist_magics.hardware import tpu_from_kind\n"
        "from kdist_magics.strategies.kernel.tpu import TPUStrategy\n"
        "import kdist_magics\n"
        "ip = InteractiveShell.instance()\n"
        "ip.run_line_magic('load_ext', 'kdist_magics')\n"
        "fake_vm = tpu_from_kind('v2-8', target='local', found_by='/dev/accel0')\n"
        "kdist_magics._extension._strategies['tpu'] = TPUStrategy(find=lambda: fake_vm, cache={})\n"
        "ip.user_ns['marker'] = 'before'\n"
        "try:\n"
        "    ip.run_cell_magic('kdist', '-s tpu --no-dashboard', 'marker = \"ran\"')\n"
        "except Exception as exc:\n"
        "    print('RESULT', type(exc).__name__, len(str(exc).splitlines()), repr(str(exc)))\n"
        "print('MARKER', ip.user_ns['marker'])\n"
    )
    env = dict(__import__("os").environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=280, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    result = next(l for l in out.stdout.splitlines() if l.startswith("RESULT "))
    _, kind, n_lines, message = result.split(" ", 3)
    assert kind == "StrategyUnavailable" and n_lines == "3"
    assert "/dev/accel0 -> local" in message and "connecting failed" in message
    assert "MARKER before" in out.stdout


@contextlib.contextmanager
def _held_tpu(tmp_path, monkeypatch):
    """A process holding a stand-in for libtpu's lock file (a crashed kernel's leftover), and
    the TPU paths pointed at it; yields the holder."""
    import time

    from kdist_magics.strategies.kernel import tpu_hygiene

    lock = tmp_path / "libtpu_lockfile"
    lock.write_text("")
    holder = subprocess.Popen([sys.executable, "-c", f"f = open({str(lock)!r}); import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 30
        while tpu_hygiene.held_by([str(lock)]) is None:
            assert time.monotonic() < deadline, "the holder never opened the lock file"
            time.sleep(0.05)
        assert tpu_hygiene.held_by([str(lock)])[0] == holder.pid
        assert tpu_hygiene.held_by([str(lock)], me=holder.pid) is None  # one's own hold is no news
        monkeypatch.setattr(tpu_hygiene, "tpu_paths", lambda found_by="": [str(lock)])
        yield holder
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.notf  # JAX only: also in .venv-colab-tpu
def test_a_tpu_held_by_another_process_is_named_in_one_line_before_the_cell(ip, tmp_path, monkeypatch):
    """The TPU held by another process (a crashed kernel's leftover holding libtpu's
    lock file, jax-ml/jax#10192) is named with its pid and the fix, and nothing runs."""
    try:
        with _held_tpu(tmp_path, monkeypatch) as holder:
            ext = kdist_magics._extension
            ext._strategies["tpu"] = TPUStrategy(
                find=lambda: tpu_from_kind("v5litepod-1", target="local", found_by="/dev/vfio/0")
            )
            ip.user_ns["marker"] = "before"
            with pytest.raises(StrategyUnavailable) as info:
                ip.run_cell_magic("kdist", "--strategy tpu --no-dashboard", "marker = 'ran'")
            said = str(info.value)
            assert f"held by another process, pid {holder.pid}" in said and f"kill {holder.pid}" in said
            assert "\n" not in said and ip.user_ns["marker"] == "before"
    finally:
        kdist_magics._extension._strategies.pop("tpu", None)


@pytest.mark.notf  # JAX only: also in .venv-colab-tpu
@pytest.mark.parametrize("line", ["--strategy default", "--strategy auto"])
def test_a_held_tpu_is_named_on_the_default_path_auto_takes_too(ip, tmp_path, monkeypatch, line):
    """Colab's v5e-1 with Keras on JAX: auto chooses default, which takes the TPU in the kernel
    as tpu does: a holder is named there too, in one line, and the cell does not run."""
    from kdist_magics import hardware
    from kdist_magics.strategies.kernel import tpu_hygiene

    from kdist_magics.choose import advisor

    chip = hardware.tpu_from_kind("v5litepod-1", target="local", found_by="/dev/vfio/0")
    monkeypatch.setattr(hardware, "detect_tpu", lambda *a, **k: chip)
    # what the advisor decides there (test_advisor: Colab's v5e-1 under JAX runs as it is)
    monkeypatch.setattr(advisor, "choose", lambda *a, **k: ("default", "one TPU chip gains nothing"))
    monkeypatch.setattr(tpu_hygiene, "backend_started", lambda: False)  # this kernel has not taken it
    with _held_tpu(tmp_path, monkeypatch) as holder:
        ip.user_ns["marker"] = "before"
        with pytest.raises(StrategyUnavailable) as info:
            ip.run_cell_magic("kdist", f"{line} --no-dashboard", "marker = 'ran'")
        said = str(info.value)
        assert f"held by another process, pid {holder.pid}" in said and "\n" not in said
        assert ip.user_ns["marker"] == "before"


def test_only_a_real_multi_host_initializer_counts_not_any_initialize():
    """A call's name matches an initializer only whole or from a dot on: ``ed.initialize()``
    or ``model.initialize()`` is not ``jax.distributed.initialize``."""
    from kdist_magics.strategies.kernel.tpu_hygiene import calls_initialize

    assert calls_initialize("import jax\njax.distributed.initialize()") == "jax.distributed.initialize"
    assert calls_initialize("from jax import distributed\ndistributed.initialize()") == "jax.distributed.initialize"
    assert calls_initialize("import keras\nkeras.distribution.initialize()") == "keras.distribution.initialize"
    for code in (
        "ed.initialize()",
        "model.initialize()",
        "d.initialize()",
        "initialize()",
        "x = 'jax.distributed.initialize()'  # a string, not a call",
    ):
        assert calls_initialize(code) is None, code


@pytest.mark.kernel
@pytest.mark.notf  # JAX only: also in .venv-colab-tpu
def test_one_tpu_chip_is_said_to_be_one_replica_on_jax():
    """On Colab's single chip (v5e-1, v6e-1) --strategy tpu runs on that chip and
    says that one chip is one replica (JAX's one device stands in for it here)."""
    from conftest import run_in_fresh_shell

    out = run_in_fresh_shell(
        """
from kdist_magics.hardware import tpu_from_kind
from kdist_magics.strategies.frameworks import on_jax
from kdist_magics.strategies.kernel.tpu import TPUStrategy
import jax
on_jax.plan_devices = lambda wanted, platform: jax.devices()[:1]  # the chip
kdist_magics._extension._strategies["tpu"] = TPUStrategy(
    find=lambda: tpu_from_kind("v5litepod-1", target="local", found_by="/dev/vfio/0"))
_, err = attempt("--strategy tpu --no-dashboard", "kd_r = strategy.num_replicas_in_sync")
out["r"] = [repr(err), ip.user_ns.get("kd_r")]
""",
        {"KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"},
        unset=("XLA_FLAGS",),
    )
    assert out["r"] == ["None", 1], out
    assert "is one replica: the cell runs on it as it would without kdist" in out["_stdout"]


@pytest.mark.kernel
@pytest.mark.notf  # JAX only: also in .venv-colab-tpu
def test_joining_a_multi_host_jax_job_too_late_is_one_line_before_the_cell():
    """``jax.distributed.initialize()`` (or Keras' wrapper) in a cell, once JAX's
    backend has started, where kdist starts it to find the devices, or a second time, is named
    in one line with the fix, and the cell does not run; in the first cell of a fresh kernel it
    runs (the default strategy leaves JAX's backend alone)."""
    from conftest import run_in_fresh_shell

    prelude = """
from kdist_magics.strategies.kernel.tpu_hygiene import backend_started
import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
JOIN = f"import jax\\njax.distributed.initialize(coordinator_address='127.0.0.1:{port}', num_processes=1, process_id=0)\\nmarker = 'ran'"
def joining(key, line, cell=None):
    ip.user_ns.pop("marker", None)
    _, err = attempt(line + " --no-dashboard", cell or JOIN)
    out[key] = [type(err).__name__, str(err), ip.user_ns.get("marker")]
"""
    env = {"KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    first = run_in_fresh_shell(
        prelude
        + """
joining("mirrored", "--strategy mirrored --devices 2")
out["started"] = backend_started()
ip.run_cell("import jax; jax.numpy.ones(1)")
joining("after JAX", "--strategy default")
""",
        env,
    )
    again = run_in_fresh_shell(
        prelude
        + """
joining("first", "--strategy default")
joining("again", "--strategy default", "import keras\\nkeras.distribution.initialize()\\nmarker = 'ran'")
""",
        env,
    )
    assert first["started"] is False  # refused before kdist looked for the devices
    for key, why in (
        ("mirrored", "--strategy mirrored starts it to find the devices"),
        ("after JAX", "it has started in this kernel"),
    ):
        name, said, marker = first[key]
        assert name == "StrategyUnavailable" and marker is None, first[key]
        assert (
            said.startswith(f"jax.distributed.initialize() must run before JAX starts its backend, and {why}")
            and "\n" not in said
        ), said
        assert "first cell of a fresh kernel" in said and said.endswith("The cell did not run.")
    assert again["first"] == ["NoneType", "None", "ran"], again["first"]
    name, said, marker = again["again"]
    assert name == "StrategyUnavailable" and marker is None, again["again"]
    assert (
        said.startswith("keras.distribution.initialize(): this kernel has joined a JAX job already")
        and "\n" not in said
    )


@pytest.mark.kernel
@pytest.mark.notf  # JAX only: also in .venv-colab-tpu
def test_eight_tpu_chips_train_data_parallel_over_eight_and_sharded_over_a_mesh_of_them(tmp_path):
    """Kaggle's v5e-8 as its runtime shows itself (``TPU_ACCELERATOR_TYPE=v5litepod-8``
    and eight ``/dev/vfio/N``; eight JAX devices, CPU ones standing in for the chips):
    ``--strategy tpu`` is DataParallel over the eight (one replica per chip, every variable
    whole on each), and ``--strategy sharded`` splits the model over a mesh of the eight."""
    from conftest import run_in_fresh_shell

    root = tmp_path / "root"
    (root / "dev" / "vfio").mkdir(parents=True)
    for n in range(8):
        (root / "dev" / "vfio" / str(n)).write_text("")
    (root / "dev" / "vfio" / "vfio").write_text("")
    out = run_in_fresh_shell(
        f"""
import jax, numpy as np
from kdist_magics.hardware import detect_tpu
from kdist_magics.strategies.frameworks import on_jax
from kdist_magics.strategies.kernel.tpu import TPUStrategy
found = detect_tpu({{"TPU_ACCELERATOR_TYPE": "v5litepod-8"}}, root={str(root)!r})
out["found"] = [found.name, found.cores, found.found_by]
on_jax.plan_devices = lambda wanted, platform: jax.devices()[:wanted or 8]  # the eight chips
kdist_magics._extension._strategies["tpu"] = TPUStrategy(find=lambda: found)
ip.run_cell('''
import numpy as np, keras
rng = np.random.default_rng(0)
x = rng.normal(size=(512, 16)).astype("float32")
y = (x @ rng.normal(size=(16, 1))).astype("float32")
''')
CELL = '''
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(64, activation='relu'), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
kd_loss = model.fit(x, y, batch_size=64, epochs=3, verbose=0).history["loss"]
kd_devices = [len(v.value.sharding.device_set) for v in model.weights]
kd_whole = [v.value.sharding.is_fully_replicated for v in model.weights]
'''
_, err = attempt("--strategy tpu --no-dashboard", CELL + "kd_r = strategy.num_replicas_in_sync")
out["tpu"] = [repr(err), ip.user_ns.get("kd_r"), ip.user_ns.get("kd_loss"),
              ip.user_ns.get("kd_devices"), ip.user_ns.get("kd_whole")]
WIDE = CELL.replace("Dense(64, activation='relu'),",  # a 256 KiB kernel: split
                    "Dense(256, activation='relu'), keras.layers.Dense(256),")
_, err = attempt("--strategy sharded --mesh 2x4 --no-dashboard", WIDE)
rec = kdist_magics.last_run()
out["sharded"] = [repr(err), list(rec.mesh or ()), ip.user_ns.get("kd_loss"),
                  ip.user_ns.get("kd_devices"), ip.user_ns.get("kd_whole")]
""",
        {"KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=8"},
    )
    assert out["found"] == ["v5e-8", 8, "/dev/vfio/0"], out["found"]
    error, replicas, loss, devices, whole = out["tpu"]
    assert error == "None", out["_stdout"][-3000:]
    assert replicas == 8 and loss[-1] < loss[0] and set(devices) == {8} and all(whole), out["tpu"]
    assert "one replica" not in out["_stdout"]  # that is the single chip's line
    error, mesh, loss, devices, whole = out["sharded"]
    assert error == "None", out["_stdout"][-3000:]
    assert mesh == [2, 4] and loss[-1] < loss[0], out["sharded"]
    assert set(devices) == {8} and whole.count(False) == 1, out["sharded"]  # the 256x256 kernel split
