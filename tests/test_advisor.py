"""Fast tier: the advisor on simulated hardware, and hardware detection with fakes.

No TensorFlow, Keras or JAX is imported here (one kernel-tier test at the end).
"""

import json
import subprocess
import sys
import types

import pytest
from IPython.core.error import UsageError

from kdist_magics.choose import advisor, facts
from kdist_magics.choose.advisor import RULES, Advice, choose, decide, facts_for
from kdist_magics.errors import StrategyUnavailable
from kdist_magics.hardware import GiB, GPU, Hardware, detect, detect_gpus, detect_tpu
from kdist_magics.spec import parse_line


def gpus(n, mem_gib=16, name="V100"):
    return [{"name": name, "memory_bytes": mem_gib * GiB}] * n


SMALL_MODEL = {"name": "model", "params": 12_000, "bytes": 48_000}
MID_MODEL = {"name": "model", "params": 25_000_000, "bytes": 100_000_000}  # ResNet-50-ish
HUGE_MODEL = {"name": "llm", "params": 3_000_000_000, "bytes": 12_000_000_000}
TINY_DATA = {"names": ["x", "y"], "bytes": 1_280, "samples": 64}
BIG_DATA = {"names": ["x_train"], "bytes": 5_000_000_000, "samples": 1_200_000}

# name: (hardware, model, data, expected strategy, words the one-line reason must contain)
CASES = {
    "cpu laptop": (
        dict(cpu_cores=2, memory_bytes=8 * GiB),
        SMALL_MODEL,
        TINY_DATA,
        "default",
        ["2 cores, no GPU", "12k parameters fits one device", "set-up"],
    ),
    "1 gpu": (
        dict(cpu_cores=8, memory_bytes=32 * GiB, gpus=gpus(1)),
        MID_MODEL,
        BIG_DATA,
        "default",
        ["1 V100 GPU", "25M parameters fits one device"],
    ),
    "8 gpus": (
        dict(cpu_cores=64, gpus=gpus(8), horovod=True),
        MID_MODEL,
        BIG_DATA,
        "mirrored",
        ["8 V100 GPUs", "splits every batch"],
    ),
    "2 hosts x 4 gpus": (
        dict(cpu_cores=64, gpus=gpus(4), hosts=2, engines=8, horovod=True),
        MID_MODEL,
        BIG_DATA,
        "horovod",
        ["2 hosts x 4 V100 GPUs", "ring-allreduce spans the hosts"],
    ),
    "tpu v2-8": (
        dict(cpu_cores=96, tpu="v2-8"),
        MID_MODEL,
        BIG_DATA,
        "tpu",
        ["TPU v2-8 (8 cores, 8 GiB each)", "TPUStrategy"],
    ),
    "tpu v5e-8 (Kaggle)": (
        dict(cpu_cores=96, tpu="v5litepod-8"),
        MID_MODEL,
        BIG_DATA,
        "tpu",
        ["TPU v5e-8 (8 chips, 16 GiB each)", "TPUStrategy replicates the model on every chip"],
    ),
    "tpu v5e-1 (Colab), tensorflow": (
        dict(cpu_cores=44, tpu="v5litepod-1"),
        MID_MODEL,
        BIG_DATA,
        "tpu",
        ["TPU v5e-1 (1 chip, 16 GiB each)", "single replica", "no data parallelism"],
    ),
    "model too big": (
        dict(cpu_cores=64, gpus=gpus(8), horovod=True),
        HUGE_MODEL,
        None,
        "mirrored",
        ["warning", "3B parameters", "45 GiB", "16 GiB", "out-of-memory"],
    ),
}


def advice_for(hw, model=None, data=None, line="", backend="tensorflow") -> Advice:
    hardware = Hardware.from_dict(hw)
    return decide(facts_for(hardware, parse_line(line), {}, model=model, data=data, backend=backend))


@pytest.mark.parametrize("case", list(CASES))
def test_each_simulated_machine(case):
    hw, model, data, expected, words = CASES[case]
    advice = advice_for(hw, model, data)
    assert advice.strategy == expected, advice
    for word in words:
        assert word in advice.reason, (word, advice.reason)
    assert "\n" not in advice.reason  # auto prints one line
    deciding = [r for r in advice.rows if r.role == "decides"]
    assert len(deciding) == 1
    # the table covers the seed's criteria
    criteria = {r.criterion for r in advice.rows}
    assert {"hardware", "model size", "set-up cost"} <= criteria


def test_colab_v5e_1_under_jax_runs_the_cell_as_it_is():
    """Colab's TPU runtime: one v5e chip and JAX. One device: nothing to parallelise over."""
    advice = advice_for(dict(cpu_cores=44, tpu="v5litepod-1"), MID_MODEL, BIG_DATA, backend="jax")
    assert advice.strategy == "default", advice
    assert "TPU v5e-1 (1 chip" in advice.reason and "gains nothing" in advice.reason
    eight = advice_for(dict(cpu_cores=96, tpu="v5litepod-8"), MID_MODEL, BIG_DATA, backend="jax")
    assert eight.strategy == "tpu" and "DataParallel over the 8 TPU devices" in eight.reason


def test_laptop_reason_names_the_deciding_observations():
    advice = advice_for(*CASES["cpu laptop"][:3])
    assert advice.reason.startswith("2 cores, no GPU; model of 12k parameters fits one device")
    assert "horovod's ~10 s engine set-up" in advice.reason and "small job" in advice.reason
    decides = next(r for r in advice.rows if r.role == "decides")
    assert decides.criterion == "training time"


def test_too_big_model_is_flagged_in_the_table():
    advice = advice_for(*CASES["model too big"][:3])
    warning = [r for r in advice.rows if r.role == "warning"]
    assert len(warning) == 1 and warning[0].criterion == "model size"
    assert "ModelParallel" in warning[0].consequence
    assert advice.reason.startswith("warning:")


def test_big_job_on_a_laptop_still_runs_in_the_kernel():
    advice = advice_for(dict(cpu_cores=2, memory_bytes=8 * GiB), MID_MODEL, BIG_DATA)
    assert advice.strategy == "default"
    assert any("does not speed training up" in r.consequence for r in advice.rows)


def test_devices_given_means_mirrored_even_on_a_laptop():
    advice = advice_for(dict(cpu_cores=2), SMALL_MODEL, TINY_DATA, line="--devices 2")
    assert advice.strategy == "mirrored"
    assert "--devices 2 given" in advice.reason


@pytest.mark.parametrize("line", ["--np 4", "--push x", "--pull model", "--profile p", "--cluster-id c"])
def test_engine_options_mean_an_engine_strategy(line):
    advice = advice_for(dict(cpu_cores=2, horovod=True), SMALL_MODEL, TINY_DATA, line=line)
    assert advice.strategy == "horovod"
    assert "given" in advice.reason


def test_min_np_means_horovod_elastic():
    advice = advice_for(dict(cpu_cores=2, horovod=True), SMALL_MODEL, TINY_DATA, line="--np 4 --min-np 2")
    assert advice.strategy == "horovod" and "--min-np 2 given" in advice.reason


def test_engine_options_without_horovod_use_multiworker():
    advice = advice_for(dict(cpu_cores=2, horovod=False), line="--np 2")
    assert advice.strategy == "multiworker"


def test_two_hosts_without_horovod_pick_multiworker():
    hw = dict(CASES["2 hosts x 4 gpus"][0], horovod=False)
    assert advice_for(hw, MID_MODEL, BIG_DATA).strategy == "multiworker"


def test_jax_backend_uses_jax_processes_across_hosts_and_gpus_never_horovod():
    hw, model, data, *_ = CASES["2 hosts x 4 gpus"]
    advice = advice_for(hw, model, data, backend="jax")
    assert advice.strategy == "multiworker"
    assert any(
        "Keras backend is jax" in r.observation and "one JAX process per engine" in r.consequence for r in advice.rows
    )
    path = next(r for r in advice.rows if r.criterion == "backend path")
    assert path.observation == "Keras on jax" and "jax.distributed" in path.consequence
    assert advice_for(hw, line="--np 2", backend="jax").strategy == "multiworker"
    one_host = dict(hw, hosts=1, engines=0)  # one host's 4 GPUs: one JAX process per GPU
    advice = advice_for(one_host, model, data, backend="jax")
    assert advice.strategy == "multiworker"
    assert any(r.role == "decides" and "4 GPUs on this host, Keras on jax" in r.observation for r in advice.rows)
    one_gpu = dict(one_host, gpus=gpus(1))  # nothing to spread over
    assert advice_for(one_gpu, model, data, backend="jax").strategy == "default"
    with pytest.raises(StrategyUnavailable) as info:
        advice_for(hw, line="--np 2", backend="numpy")
    assert "TensorFlow, JAX or torch" in str(info.value)


def test_torch_backend_uses_torch_processes_for_gpus_and_hosts():
    hw, model, data, *_ = CASES["8 gpus"]
    advice = advice_for(hw, model, data, backend="torch")
    assert advice.strategy == "multiworker"
    path = next(r for r in advice.rows if r.criterion == "backend path")
    assert "torch.distributed" in path.consequence and "DistributedDataParallel" in path.consequence
    assert advice_for(hw, line="--np 2", backend="torch").strategy == "multiworker"
    hosts, model, data, *_ = CASES["2 hosts x 4 gpus"]
    assert advice_for(hosts, model, data, backend="torch").strategy == "multiworker"
    # mirrored and tpu drive TF or JAX: never under torch
    assert advice_for(hw, line="--devices 2", backend="torch").strategy != "mirrored"


def test_rules_are_data():
    assert all(isinstance(r, advisor.Rule) for r in RULES)
    criteria = {r.criterion for r in RULES}
    assert {"your options", "hardware", "model size", "data size", "training time", "set-up cost"} == criteria
    assert RULES[-1].pick == ("default",) and RULES[-1].when({})  # always something to fall back on


def test_tables_text_and_html():
    advice = advice_for(*CASES["8 gpus"][:3])
    text = repr(advice)
    assert text.splitlines()[0].startswith("kdist advise: mirrored -- ")
    assert "criterion" in text and "observation" in text and "consequence" in text
    assert "hardware *" in text  # the deciding row is marked
    page = advice._repr_html_()
    assert page.count("<tr") == len(advice.rows) + 1
    assert "<th>criterion</th><th>observation</th><th>consequence</th>" in page


def test_html_is_escaped():
    advice = advice_for(dict(cpu_cores=2), {"name": "<b>m</b>", "params": 10, "bytes": 40}, None)
    assert "<b>m</b>" not in advice._repr_html_() and "&lt;b&gt;m&lt;/b&gt;" in advice._repr_html_()


# -- inspecting the namespace ------------------------------------------------


class FakeWeight:
    def __init__(self, shape, dtype="float32"):
        self.shape, self.dtype = shape, dtype


def test_model_and_data_from_the_namespace(monkeypatch):
    import numpy as np

    class Model:
        def __init__(self, *shapes):
            self.weights = [FakeWeight(s) for s in shapes]

    class Unbuilt(Model):
        @property
        def weights(self):
            raise ValueError("not built")

        @weights.setter
        def weights(self, value):
            pass

    fake = types.SimpleNamespace(Model=Model, backend=types.SimpleNamespace(backend=lambda: "tensorflow"))
    monkeypatch.setitem(sys.modules, "keras", fake)
    ns = {
        "small": Model((4, 1), (1,)),
        "big": Model((100, 100), (100,)),
        "raw": Unbuilt(),
        "x": np.zeros((1000, 8), "float32"),
        "y": np.zeros((1000,), "float32"),
        "n": 3,
        "_hidden": Model((9999, 9)),
    }
    model = facts.inspect_model(ns)
    assert model == {"name": "big", "params": 10_100, "bytes": 40_400}
    data = facts.inspect_data(ns)
    assert data["bytes"] == 32_000 + 4_000 and data["samples"] == 1000 and set(data["names"]) == {"x", "y"}
    choice, reason = choose(ns, parse_line(""), hardware=Hardware.from_dict(dict(cpu_cores=2, memory_bytes=8 * GiB)))
    assert choice == "default" and "model of 10k parameters fits one device" in reason


def test_inspection_imports_nothing_heavy():
    code = (
        "import sys, numpy as np\n"
        "from kdist_magics.choose.advisor import advise\n"
        "a = advise({'x': np.zeros((100, 10))}, None)\n"
        "assert a.strategy == 'default', a\n"
        "heavy = [m for m in ('tensorflow', 'keras', 'jax', 'horovod') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "print('clean')\n"
    )
    env = {"KDIST_HARDWARE": json.dumps({"cpu_cores": 2}), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert "clean" in out.stdout


# -- the magics ---------------------------------------------------------------


def test_kdist_advise_shows_the_table(ip, monkeypatch):
    monkeypatch.setenv("KDIST_HARDWARE", json.dumps({"cpu_cores": 64, "gpus": gpus(8), "horovod": True}))
    advice = ip.run_line_magic("kdist", "advise")
    assert isinstance(advice, Advice) and advice.strategy == "mirrored"
    assert advice.hardware.source == "simulated"
    with pytest.raises(UsageError):
        ip.run_line_magic("kdist", "advise --np 0")


# -- hardware detection -------------------------------------------------------


def test_hardware_round_trips_as_json():
    hw = Hardware.from_dict({"cpu_cores": 8, "gpus": gpus(2), "tpu": "v3-8", "hosts": 2})
    again = Hardware.from_dict(json.loads(json.dumps(hw.to_dict())))
    assert again == hw
    assert hw.tpu.memory_per_core_bytes == 16 * GiB and hw.device_memory_bytes == 16 * GiB


def test_kdist_hardware_env_simulates(monkeypatch):
    hw = detect(env={"KDIST_HARDWARE": json.dumps({"cpu_cores": 3})})
    assert hw.cpu_cores == 3 and hw.source == "simulated"


def test_detect_here_is_plain_and_cheap():
    code = (
        "import sys, json\n"
        "from kdist_magics.hardware import detect, horovod_importable\n"
        "import importlib.util\n"
        "hw = detect(env={})\n"
        "assert hw.cpu_cores >= 1 and hw.tpu is None and hw.source == 'detected', hw\n"
        "json.dumps(hw.to_dict())\n"
        "assert hw.horovod == (importlib.util.find_spec('horovod') is not None)\n"
        "heavy = [m for m in ('tensorflow', 'keras', 'jax', 'horovod') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "print('clean')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "clean" in out.stdout


def test_no_nvml_means_no_gpus(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert detect_gpus({}) == ()


def test_gpus_through_a_fake_nvml(monkeypatch):
    calls = []
    fake = types.SimpleNamespace(
        nvmlInit=lambda: calls.append("init"),
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: b"NVIDIA A100-SXM4-80GB",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=80 * GiB),
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert detect_gpus({}) == (GPU("A100-SXM4-80GB", 80 * GiB),) * 2
    assert calls == ["init", "shutdown"]
    assert len(detect_gpus({"CUDA_VISIBLE_DEVICES": "1"})) == 1
    assert detect_gpus({"CUDA_VISIBLE_DEVICES": ""}) == ()


@pytest.mark.parametrize(
    "env, files, target, kind, found_by",
    [
        ({"COLAB_TPU_ADDR": "10.0.0.2:8470"}, [], "grpc://10.0.0.2:8470", "v2-8", "COLAB_TPU_ADDR"),
        (
            {"TPU_NAME": "grpc://10.1.2.3:8470", "TPU_ACCELERATOR_TYPE": "v3-8"},
            [],
            "grpc://10.1.2.3:8470",
            "v3-8",
            "TPU_NAME",
        ),
        ({}, ["dev/accel0", "dev/accel1", "dev/accel2", "dev/accel3"], "local", "tpu-8", "/dev/accel0"),
        (
            {"TPU_ACCELERATOR_TYPE": "v5litepod-8"},
            ["dev/vfio/0", "dev/vfio/vfio"],
            "local",
            "v5litepod-8",
            "/dev/vfio/0",
        ),
        ({"TPU_NAME": "local"}, [], "local", "tpu", "TPU_NAME"),
    ],
)
def test_tpu_detection(tmp_path, env, files, target, kind, found_by):
    for f in files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("")
    tpu = detect_tpu(env, root=str(tmp_path))
    assert (tpu.target, tpu.kind, tpu.found_by) == (target, kind, found_by)


def test_no_tpu(tmp_path):
    (tmp_path / "dev").mkdir()
    assert detect_tpu({}, root=str(tmp_path)) is None


# -- auto in a real kernel ----------------------------------------------------


@pytest.mark.kernel
@pytest.mark.timeout(300)
def test_auto_prints_one_line_and_runs(ip, monkeypatch, capsys):
    import kdist_magics

    monkeypatch.setenv("KDIST_HARDWARE", json.dumps({"cpu_cores": 2, "memory_bytes": 8 * GiB}))
    ip.run_cell_magic("kdist", "--no-dashboard", "ran_under_auto = True")
    out = capsys.readouterr().out
    line = [s for s in out.splitlines() if s.startswith("kdist: --strategy auto chose default: ")]
    assert len(line) == 1 and "2 cores, no GPU" in line[0], out
    assert ip.user_ns["ran_under_auto"] is True
    rec = kdist_magics.last_run()
    assert rec.strategy == "default" and rec.reason in line[0]


def test_engines_of_a_cluster_a_strategy_holds_are_counted(monkeypatch):
    monkeypatch.delenv("KDIST_HARDWARE", raising=False)
    engines = [types.SimpleNamespace(engine_id=i, hostname=h) for i, h in enumerate("aabb")]
    magics = types.SimpleNamespace(
        _strategies={
            "default": object(),
            "horovod": types.SimpleNamespace(cluster=types.SimpleNamespace(engines=engines)),
        }
    )
    hw = advisor.hardware_for(magics)
    assert (hw.engines, hw.hosts) == (4, 2)
    assert advisor.hardware_for(types.SimpleNamespace(_strategies={})).engines == 0


@pytest.mark.kernel
@pytest.mark.timeout(300)
def test_advise_reads_a_real_keras_model_and_arrays(ip, monkeypatch):
    from conftest import run_cell

    monkeypatch.setenv("KDIST_HARDWARE", json.dumps({"cpu_cores": 2, "memory_bytes": 8 * GiB}))
    run_cell(
        ip,
        "import numpy as np, keras\n"
        "x = np.zeros((500, 20), 'float32'); y = np.zeros((500, 1), 'float32')\n"
        "net = keras.Sequential([keras.Input((20,)), keras.layers.Dense(64), keras.layers.Dense(1)])",
    )
    advice = ip.run_line_magic("kdist", "advise")
    params = ip.user_ns["net"].count_params()
    assert params == 20 * 64 + 64 + 64 + 1
    model_row = next(r for r in advice.rows if r.criterion == "model size")
    assert f"model 'net' of {facts.human(params)} parameters" in model_row.observation
    data_row = next(r for r in advice.rows if r.criterion == "data size")
    assert "500 samples" in data_row.observation and "42 kB" in data_row.observation
    assert advice.strategy == "default"


def test_other_backends_keep_to_default():
    hw, model, data, *_ = CASES["8 gpus"]
    advice = advice_for(hw, model, data, backend="numpy")
    assert advice.strategy == "default"
    assert any("only default fits" in r.consequence for r in advice.rows)


def test_advise_does_not_contradict_itself_on_small_data_and_short_epochs():
    """1.0k samples (4.2 MB) beside a large model were "large data: more devices
    shorten each epoch", and an epoch "under a second" was "long enough that more devices pay
    off"; the deciding row's mark was in the text table only."""
    from kdist_magics.choose.advisor import RULES
    from kdist_magics.choose.facts import BIG_DATA_BYTES, SMALL_EPOCH_S

    data_rule = next(r for r in RULES if r.criterion == "data size")
    time_rule = next(r for r in RULES if r.criterion == "training time" and not r.pick)
    small = {"data_bytes": 4.2e6, "big_job": True}  # big because of the model, not the data
    assert data_rule.text("consequence", small).startswith("small data")
    assert data_rule.text("consequence", {"data_bytes": BIG_DATA_BYTES, "big_job": True}).startswith("large data")
    short = {"epoch_s": 0.5, "small_job": False}
    assert "long enough" not in time_rule.text("consequence", short)
    assert time_rule.text("consequence", {"epoch_s": SMALL_EPOCH_S * 2}) == "long enough that more devices pay off"


def test_the_html_table_marks_the_deciding_row_as_the_text_does(ip):
    advice = ip.run_line_magic("kdist", "advise")
    decides = next(r for r in advice.rows if r.role == "decides")
    page = advice._repr_html_()
    assert f"{decides.criterion} *" in page and "* decides" in page and "* decides" in repr(advice)
