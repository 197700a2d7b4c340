"""``--push`` of large arrays, one copy per host and nothing sent twice.

Engines tier (real engines on this host, Keras on JAX, so they start fast): the arrays reach every
rank equal, through shared memory mapped copy-on-write (a rank that writes to its copy changes
no other rank's); nothing is left in ``/dev/shm`` after a push; an unchanged value pushed again
is bound from what the ranks hold (the same objects), a changed one (in the notebook, or on a
rank) is sent again; what is not an array travels as before. Fast tier: the fingerprint and the
refusal of a push larger than free memory.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import run_in_fresh_shell
from kdist_magics.rank import shared

PROP_LINE = "--strategy multiworker --np 2 --no-dashboard --push x,df,v"
LINE = "--strategy multiworker --np 2 --no-dashboard --push x,pair,small,meta,df"
CELL = (
    "import numpy as np\n"
    "kd_root = x\n"
    "while isinstance(kd_root, np.ndarray) and kd_root.base is not None:\n"
    "    kd_root = kd_root.base  # what the array's memory is\n"
    "kd_root = kd_root.obj if isinstance(kd_root, memoryview) else kd_root\n"
    "kd_seen = [float(x.sum()), float(pair[1].sum()), small.tolist(), meta, id(x),\n"
    "           type(kd_root).__name__, bool(x.flags.writeable)]\n"
    "kd_col = df['a'].to_numpy()\n"
    "while isinstance(kd_col, np.ndarray) and kd_col.base is not None:\n"
    "    kd_col = kd_col.base\n"
    "kd_col = kd_col.obj if isinstance(kd_col, memoryview) else kd_col\n"
    "kd_frame = [float(df['a'].sum()), int(df['b'].sum()), list(df.columns), int(df.index[-1]),\n"
    "            type(kd_col).__name__, id(df)]\n"
)


@pytest.mark.engines
@pytest.mark.timeout(400)
def test_pushed_arrays_are_shared_once_per_host_and_not_sent_twice():
    out = run_in_fresh_shell(
        f"""
import glob, os, numpy as np
rng = np.random.default_rng(0)
x = rng.normal(size=(512, 1024)).astype("float32")          # 2 MiB: shared
pair = (np.arange(300_000, dtype="float64"), np.ones(400_000, dtype="float32"))
small, meta = np.arange(5), {{"classes": 10}}                  # inline, as before
import pandas as pd                                           # a frame: column by column
df = pd.DataFrame({{"a": rng.normal(size=300_000), "b": np.arange(300_000)}}, index=np.arange(300_000) * 2)
ip.user_ns.update(x=x, pair=pair, small=small, meta=meta, df=df)  # the notebook's variables
def cell(extra=""):
    _, err = attempt({LINE!r}, {CELL!r} + extra)
    assert err is None, repr(err)
    return by_rank("kd_seen")
out["first"] = cell()
out["frame"] = by_rank("kd_frame")
out["frame sums"] = [float(df["a"].sum()), int(df["b"].sum())]
out["shm_after"] = glob.glob(f"/dev/shm/kdist-{{os.getpid()}}-*")  # this kernel's
out["again"] = cell()
out["frame again"] = by_rank("kd_frame")
x[0, 0] += 1.0                                               # changed in the notebook
out["changed"] = cell()
out["written"] = cell("import jax\\nif jax.process_index() == 0:\\n    x[:] = 0\\n"
                      "kd_seen[0] = float(x.sum())\\n")  # rank 0 writes to its copy
out["after_write"] = cell()
out["sums"] = [float(x.sum()), float(pair[1].sum())]
ip.run_line_magic("kdist", "stop")
out["shm_end"] = glob.glob(f"/dev/shm/kdist-{{os.getpid()}}-*")
""",
        {"KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"},
        unset=("XLA_FLAGS",),
    )
    first, again, changed = out["first"], out["again"], out["changed"]
    for ranks in (first, again):
        for seen in ranks:
            assert seen[1:4] == [400_000.0, [0, 1, 2, 3, 4], {"classes": 10}], seen
            assert seen[5] == "mmap" and seen[6] is True  # shared, and a cell may write (its own copy)
    assert first[0][0] == pytest.approx(first[1][0])  # the same data on both ranks
    assert out["shm_after"] == [] and out["shm_end"] == []  # no name left in /dev/shm
    a_sum, b_sum = out["frame sums"]
    for frame in out["frame"]:  # a DataFrame's columns on the shared pages, its index as it was
        assert frame[0] == pytest.approx(a_sum) and frame[1:4] == [b_sum, ["a", "b"], 599_998]
        assert frame[4] == "mmap", frame
    assert [f[5] for f in out["frame again"]] == [f[5] for f in out["frame"]]  # not sent twice
    assert [r[4] for r in again] == [r[4] for r in first]  # unchanged: the same objects, not sent
    assert [r[4] for r in changed] != [r[4] for r in first]  # changed in the notebook: sent again
    assert changed[0][0] == pytest.approx(out["sums"][0], rel=1e-6) == changed[1][0]
    written, after = out["written"], out["after_write"]
    assert written[0][0] == 0.0 and written[1][0] == pytest.approx(out["sums"][0], rel=1e-6)  # COW
    assert after[0][0] == pytest.approx(out["sums"][0], rel=1e-6)  # rank 0's written copy: sent again
    assert after[1][4] == written[1][4]  # rank 1's untouched copy: bound again, not sent


def test_a_frame_of_numbers_travels_column_by_column_and_one_of_strings_as_before():
    pd = pytest.importorskip("pandas")
    from multiprocessing import shared_memory

    made = []

    def segment(nbytes):
        seg = shared_memory.SharedMemory(create=True, size=nbytes)
        made.append(seg)
        return seg.name, seg.buf

    rng = np.random.default_rng(0)
    df = pd.DataFrame(
        {
            "a": rng.normal(size=200_000),
            "b": np.arange(200_000, dtype="int32"),
            "when": pd.date_range("2026-01-01", periods=200_000, freq="s"),
        },
        index=np.arange(200_000) * 3,
    )
    assert shared.shareable(df) and [a.nbytes for a in shared.arrays(df)] == [1_600_000, 800_000, 1_600_000]
    desc = None
    try:
        desc = shared.describe(df, segment)
        assert [d[1][0] for d in desc[1]] == ["array", "value", "array"]  # b is under 1 MiB: inline
        back = shared._build(desc)
        pd.testing.assert_frame_equal(back, df)
        assert shared.fingerprint(back) == shared.fingerprint(df)
    finally:
        del desc
        for seg in made:
            seg.close()
            seg.unlink()
    changed = df.copy()
    changed.iloc[5, 0] += 1
    assert shared.fingerprint(changed) != shared.fingerprint(df)
    assert shared.fingerprint(df.set_axis(df.index + 1)) != shared.fingerprint(df)  # the index too
    words = pd.DataFrame({"name": ["x"] * 300_000, "v": np.zeros(300_000)})
    assert shared.frame_columns(words) is None and not shared.shareable(words)  # pickled, as before


def test_the_fingerprint_sees_every_change_and_moved_rows():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4096, 16)).astype("float32")
    base = shared.fingerprint(x)
    assert shared.fingerprint(x.copy()) == base  # content, not identity
    y = x.copy()
    y[2000, 3] += 1e-3
    assert shared.fingerprint(y) != base
    z = x.copy()
    rng.shuffle(z)  # rows moved in place: the same sum
    assert shared.fingerprint(z) != base
    assert shared.fingerprint((x, {"a": 1})) != shared.fingerprint((x, {"a": 2}))
    assert shared.fingerprint(x[:100]) != shared.fingerprint(x[:101])


def test_a_copy_on_write_mapping_tells_whether_this_process_wrote_to_it(tmp_path):
    """The engines' check before binding a held value again: pages written since mapping."""
    import mmap

    path = tmp_path / "segment"
    path.write_bytes(np.arange(2**20, dtype="float32").tobytes())
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    x = np.frombuffer(mapped, dtype="float32")
    if shared.written(x) is None:
        pytest.skip("/proc/self/pagemap cannot be read here (the engines then read the content)")
    assert shared.written(x) is False
    assert float(x[1000]) == 1000.0 and shared.written(x) is False  # read: still the file's page
    x[123_456] = -1.0
    assert shared.written(x) is True


def test_segments_of_a_kernel_that_died_mid_push_are_swept(tmp_path):
    """A kernel killed between making a segment and removing its name leaves ``kdist-<pid>-*``
    in /dev/shm; the next push on the host removes those whose kernel is gone, no other."""
    import os
    import subprocess
    import sys

    from kdist_magics.strategies.engines.push import sweep

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for name in (f"kdist-{dead.pid}-0a1b", f"kdist-{os.getpid()}-0a1b", "other-1-2"):
        (tmp_path / name).write_bytes(b"x")
    assert sweep(str(tmp_path)) == [f"kdist-{dead.pid}-0a1b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"kdist-{os.getpid()}-0a1b", "other-1-2"])
    # the guard that follows a kernel's cluster removes that kernel's names as it dies
    from kdist_magics.cluster.lifetime import remove_segments

    (tmp_path / "kdist-12345-0a1b").write_bytes(b"x")
    (tmp_path / "kdist-12346-0a1b").write_bytes(b"x")
    assert remove_segments(of_pid=12345, folder=str(tmp_path)) == ["kdist-12345-0a1b"]
    assert (tmp_path / "kdist-12346-0a1b").exists()


def test_no_room_in_dev_shm_means_each_engine_its_own_copy_not_a_crash(ip, monkeypatch):
    """Writing a segment past a full /dev/shm (a container's is often 64 MiB) kills the writer
    with SIGBUS: where there is no room, the value is bound as it came (another host's first
    engine), and the kernel says so and sends each engine its own copy."""
    import shutil

    x = np.ones(2**20, dtype="float32")
    assert shared.room(4 * 2**20) is None  # 4 MiB fit here
    free = shutil.disk_usage("/dev/shm").free
    assert shared.room(free * 2) is not None and shared.room(free * 2) <= free
    monkeypatch.setattr(shared, "room", lambda nbytes, folder="/dev/shm": 1024)
    made_before = list(shared.MADE)
    assert shared.host_share("kd_x", x, "print", others=True) is None
    assert ip.user_ns["kd_x"] is x and shared.MADE == made_before  # bound as it came, no segment
    shared.HELD.pop("kd_x", None)


EDIT_CELL = (
    "import hashlib, re, numpy as np\n"
    "def kd_sha(a):\n"
    "    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()\n"
    "kd_seen = [kd_sha(x), kd_sha(df['a'].to_numpy()), kd_sha(df['b'].to_numpy()), kd_sha(v)]\n"
    "with open('/proc/self/maps') as f:\n"
    "    kd_maps = sorted(set(re.findall(r'/dev/shm/(kdist-[0-9a-f-]+)', f.read())))\n"
)


@pytest.mark.engines
@pytest.mark.timeout(600)
def test_every_edit_reaches_the_ranks_and_nothing_replaced_is_kept():
    """Property test on real engines: Hypothesis edits a pushed array in place (a sort, a swap,
    a permutation within or across 4 KiB blocks, paired +k/-k, one flipped bit, an edit through
    a view), a DataFrame's cell, or the base of a pushed view; after each, the same --push cell
    runs and every rank must hold exactly the notebook's bytes (SHA-256 on the rank), the run's
    record must say "shared" for what changed and "unchanged, not sent" for the rest, and the
    engines must map no more segments than the values have arrays: nothing replaced is kept.
    After %kdist stop, nothing is mapped anywhere and no name is left in /dev/shm."""
    tests = str(Path(__file__).parent)
    out = run_in_fresh_shell(
        f"""
import glob, hashlib, os, sys
import numpy as np, pandas as pd
from hypothesis import HealthCheck, given, settings, strategies as st
sys.path.insert(0, {tests!r})
from test_push_edits import ROWS, COLS, edits
rng = np.random.default_rng(0)
x = rng.random((ROWS, COLS))                                        # 1 MiB: a segment
df = pd.DataFrame({{"a": rng.random(140_000), "b": np.arange(140_000)}})
base = rng.random((4096, 40))
v = base[:, 8:]                                                     # a strided view, 1 MiB
ip.user_ns.update(x=x, df=df, v=v)
sha = lambda a: hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()
want = lambda: [sha(x), sha(df["a"].to_numpy()), sha(df["b"].to_numpy()), sha(v)]
def push():
    _, err = attempt({PROP_LINE!r}, {EDIT_CELL!r})
    assert err is None, repr(err)
    return by_rank("kd_seen"), by_rank("kd_maps"), dict(kdist_magics.last_run().pushed)
out["problems"], out["examples"], out["maps"], out["kinds"] = [], 0, [], []
seen, maps, pushed = push()
out["first"] = pushed
@settings(max_examples=12, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(edits(), st.sampled_from(["x", "df", "v"]), st.integers(0, 139_999), st.integers(0, 39))
def each(edit, target, row, col):
    kind, apply = edit
    before = want()
    if target == "x":
        apply(x)
    elif target == "df":
        kind = "a DataFrame cell"
        df.iat[row, 0] = df.iat[row, 0] + 0.5
    else:
        kind = "the view's base"
        base[row % 4096, col] += 1.0                                # inside the view or not
    now = want()
    seen, maps, pushed = push()
    out["examples"] += 1
    out["kinds"].append(kind)
    out["maps"].append([len(m) for m in maps])
    if any(s != now for s in seen):
        out["problems"].append([kind, "a rank holds other bytes than the notebook"])
    names = ["x", "df", "df", "v"]
    for i, name in enumerate(names):
        if (before[i] != now[i]) and pushed[name] == "unchanged, not sent":
            out["problems"].append([kind, name + " changed but was not sent"])
    for name in ("x", "df", "v"):
        idx = [i for i, n in enumerate(names) if n == name]
        if all(before[i] == now[i] for i in idx) and pushed[name] != "unchanged, not sent":
            out["problems"].append([kind, name + " unchanged but sent: " + pushed[name]])
each()
ip.run_line_magic("kdist", "stop")
out["shm_end"] = glob.glob(f"/dev/shm/kdist-{{os.getpid()}}-*")
""",
        {"KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"},
        unset=("XLA_FLAGS",),
    )
    assert out["first"] == {"x": "shared", "df": "shared", "v": "shared"}
    assert out["problems"] == [], out["problems"]
    assert out["examples"] == 12
    # x, df's two columns and v: four segments mapped at most, however many pushes replaced them
    assert all(n <= 4 for counts in out["maps"] for n in counts), out["maps"]
    assert out["shm_end"] == []


@pytest.mark.engines
@pytest.mark.timeout(400)
def test_without_room_in_dev_shm_each_engine_gets_its_own_copy_said_and_checked():
    """A container's 64 MiB /dev/shm: the kernel says so in one line, each engine gets a copy
    of its own ("sent"), an unchanged repeat is bound again after each engine hashed its copy
    ("unchanged, not sent"), and a changed value is sent again."""
    out = run_in_fresh_shell(
        """
import hashlib
import numpy as np
from kdist_magics.rank import shared
shared.room = lambda nbytes, folder="/dev/shm": 1024   # this host's /dev/shm: full
rng = np.random.default_rng(3)
x = rng.random((512, 512))                                    # 2 MiB
ip.user_ns["x"] = x
line = "--strategy multiworker --np 2 --no-dashboard --push x"
cell = "import hashlib\\nkd_seen = [hashlib.sha256(x.tobytes()).hexdigest(), type(x.base).__name__]\\n"
said = []
for step in range(3):
    if step == 2:
        x[7, 7] = -1.0                                        # changed in place
    _, err = attempt(line, cell)
    assert err is None, repr(err)
    said.append([kdist_magics.last_run().pushed["x"], by_rank("kd_seen"),
                 hashlib.sha256(x.tobytes()).hexdigest()])
out["said"] = said
ip.run_line_magic("kdist", "stop")
""",
        {"KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"},
        unset=("XLA_FLAGS",),
    )
    outcomes = [s[0] for s in out["said"]]
    assert outcomes == ["sent", "unchanged, not sent", "sent"], outcomes
    for outcome, seen, want in out["said"]:
        assert [s[0] for s in seen] == [want, want]  # every rank holds the notebook's bytes
        assert all(s[1] != "mmap" for s in seen)  # a copy of its own, not a shared mapping
    assert "/dev/shm has 0 MiB free" in out["_stdout"] and "each engine gets its own copy" in out["_stdout"]
