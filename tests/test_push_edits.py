"""``--push`` sends a value again after any edit, and counts every copy before it makes one.

Fast tier: property tests (Hypothesis) of the fingerprint that decides "unchanged, not sent":
edits that the former fingerprint (sums of 64-bit words per 4 KiB block) could not see, a sort
in place, a swap, a permutation within or across blocks, paired +k/-k edits, one flipped bit,
an edit through a view, a DataFrame cell, each change it, and nothing else does; the travelling
description keeps a Fortran array's order and a structured dtype's fields; the engines are
grouped by machine, not by host name; a push that would not fit a machine's free memory is
refused in one line before anything is sent, counting one copy per engine where shared memory
cannot be used and asking another machine's engines for theirs.
The same edits on real engines: tests/test_push.py (engines tier).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdist_magics.cluster.liveness import EngineInfo
from kdist_magics.cluster.machine import machine_id, same_machine
from kdist_magics.rank import shared
from kdist_magics.errors import KDistError
from kdist_magics.strategies.engines import push

ROWS, COLS = 2048, 64  # 1 MiB of float64 (a segment on engines): 256 blocks of 4 KiB, 8 rows a block
FAST_ROWS = 256  # the fast tier's array: 128 KiB, 32 blocks of 4 KiB (the same edits, cheaper)


def _base(rows: int = FAST_ROWS) -> np.ndarray:
    return np.random.default_rng(7).random((rows, COLS))


@st.composite
def edits(draw, rows: int = ROWS):
    """(name, function editing an array of ``rows`` x COLS float64 in place)."""
    kind = draw(
        st.sampled_from(
            [
                "within a block",
                "across blocks",
                "sort rows",
                "paired +-k",
                "one bit",
                "through a view",
                "swap two",
                "rows shuffled",
            ]
        )
    )
    if kind == "within a block":
        block = draw(st.integers(0, rows * COLS // 512 - 1))
        start = block * 512 + draw(st.integers(0, 500))
        stop = min(start + draw(st.integers(2, 12)), (block + 1) * 512)
        perm = draw(st.permutations(range(stop - start)))
        return kind, lambda x: x.reshape(-1).__setitem__(slice(start, stop), x.reshape(-1)[start:stop][np.array(perm)])
    if kind == "across blocks":
        i, j = draw(st.lists(st.integers(0, rows * COLS - 1), min_size=2, max_size=2, unique=True))
        return kind, lambda x: x.reshape(-1).__setitem__([i, j], x.reshape(-1)[[j, i]])
    if kind == "sort rows":
        return kind, lambda x: x.sort(axis=1)
    if kind == "paired +-k":  # the former fingerprint's sums could not see these
        i = draw(st.integers(0, rows * COLS - 2))
        j = draw(st.integers(i + 1, min(i + 511, rows * COLS - 1)))
        k = draw(st.integers(1, 2**20))

        def paired(x):
            words = x.reshape(-1).view(np.uint64)
            words[i] += np.uint64(k)
            words[j] -= np.uint64(k)

        return kind, paired
    if kind == "one bit":
        byte, bit = draw(st.integers(0, rows * COLS * 8 - 1)), draw(st.integers(0, 7))
        return (
            kind,
            lambda x: (
                x.reshape(-1).view(np.uint8).__setitem__(byte, x.reshape(-1).view(np.uint8)[byte] ^ np.uint8(1 << bit))
            ),
        )
    if kind == "through a view":
        r, c = draw(st.integers(0, rows // 2 - 1)), draw(st.integers(0, COLS - 1))
        return kind, lambda x: x[::2].__setitem__((r, c), x[::2][r, c] + 1.0)
    if kind == "rows shuffled":
        perm = draw(st.permutations(range(8)))  # 8 rows: one 4 KiB block
        return kind, lambda x: x.__setitem__(slice(0, 8), x[:8][np.array(perm)])
    i, j = draw(st.lists(st.integers(0, rows * COLS - 1), min_size=2, max_size=2, unique=True))
    return kind, lambda x: x.reshape(-1).__setitem__([i, j], x.reshape(-1)[[j, i]])


@settings(max_examples=200, deadline=None, database=None)
@given(edits(FAST_ROWS))
def test_any_edit_that_changes_a_byte_changes_the_fingerprint(edit):
    kind, apply = edit
    x = _base()
    before, raw = shared.fingerprint(x), x.tobytes()
    apply(x)
    changed = x.tobytes() != raw
    assert (shared.fingerprint(x) != before) == changed, kind


def test_the_edits_the_former_fingerprint_missed():
    """The issue's own cases: each row sorted in place, two values swapped."""
    rng = np.random.default_rng(0)
    x = rng.random((20_000, 64))
    a = shared.fingerprint(x)
    x.sort(axis=1)
    assert shared.fingerprint(x) != a
    y = rng.random(100_000)
    b = shared.fingerprint(y)
    y[[10, 20]] = y[[20, 10]]
    assert shared.fingerprint(y) != b


def test_what_an_array_is_besides_its_bytes_counts():
    x = np.arange(24, dtype="int32").reshape(4, 6)
    assert shared.fingerprint(x) == shared.fingerprint(x.copy())  # content, not identity
    assert shared.fingerprint(x) != shared.fingerprint(x.reshape(6, 4))  # shape
    assert shared.fingerprint(x) != shared.fingerprint(x.view("float32"))  # dtype
    assert shared.fingerprint(x) != shared.fingerprint(np.asfortranarray(x))  # memory order
    assert shared.fingerprint(x) != shared.fingerprint(x.astype(">i4"))  # byte order
    a = np.zeros(3, dtype=[("a", "<f8"), ("b", "<i4")])
    b = np.zeros(3, dtype=[("c", "<f8"), ("b", "<i4")])
    assert shared.fingerprint(a) != shared.fingerprint(b)  # a structured dtype's fields
    masked = np.ma.masked_array(np.arange(5.0), mask=[0, 0, 1, 0, 0])
    other = masked.copy()
    other.mask[2] = False
    assert shared.fingerprint(masked) != shared.fingerprint(other)  # more than its bytes
    assert not shared.segment_worthy(np.ma.masked_array(np.zeros(2**18)))  # pickled whole


def test_a_frame_cell_and_a_views_base_change_it():
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"a": np.arange(100_000, dtype="float64"), "b": np.zeros(100_000)})
    before = shared.fingerprint(df)
    df.iat[50_000, 1] = 3.0
    assert shared.fingerprint(df) != before
    base = np.zeros((1000, 64))
    view = base[:, 8:]  # a strided view: its bytes read through one copy
    before = shared.fingerprint(view)
    base[500, 40] = 1.0
    assert shared.fingerprint(view) != before
    before = shared.fingerprint(view)
    base[500, 2] = 1.0  # outside the view: the view is unchanged
    assert shared.fingerprint(view) == before


def _round_trip(value):
    from multiprocessing import shared_memory

    made = []

    def segment(nbytes):
        seg = shared_memory.SharedMemory(create=True, size=nbytes)
        made.append(seg)
        return seg.name, seg.buf

    try:
        desc = shared.describe(value, segment)
        back = shared._build(desc)
        return back, np.array(back, copy=True)
    finally:
        del desc
        for seg in made:
            try:
                seg.close()
            except BufferError:  # the built array still maps it
                pass
            seg.unlink()


def test_the_ranks_get_a_fortran_array_and_a_structured_dtype_as_they_are():
    f = np.asfortranarray(np.random.default_rng(0).random((512, 600)))
    back, content = _round_trip(f)
    assert back.flags.f_contiguous and not back.flags.c_contiguous
    np.testing.assert_array_equal(content, f)
    assert shared.fingerprint(back) == shared.fingerprint(f)
    s = np.zeros(100_000, dtype=[("x", "<f8"), ("label", "<i4")])
    s["x"], s["label"] = np.arange(100_000), 7
    back, content = _round_trip(s)
    assert back.dtype == s.dtype and back.dtype.names == ("x", "label")
    np.testing.assert_array_equal(content, s)


Pair = namedtuple("Pair", "x y")


def test_a_namedtuple_travels_whole_not_as_a_plain_tuple():
    value = Pair(np.zeros(2**18), 1)
    assert not shared.shareable(value)  # pickled as ipyparallel sends it: its type kept
    assert shared.fingerprint(value) != shared.fingerprint((np.zeros(2**18), 1))


# -- machines, not host names -------------------------------------------------------------
def test_two_hosts_that_share_a_name_are_two_machines():
    import socket

    name = socket.gethostname()
    here = machine_id()
    host, boot, shm = here.split("/")
    assert host == name and len(boot) >= 32  # this kernel's boot id
    twin = f"{name}/{'0' * 36}/{shm}"  # another machine answering the same name
    engines = [
        EngineInfo(0, 101, name, here),
        EngineInfo(1, 102, name, twin),
        EngineInfo(2, 103, name, here),
        EngineInfo(3, 104, name, twin),
    ]
    hosts = push.group(engines)
    assert [(h.here, [e.engine_id for e in h.engines]) for h in hosts] == [(True, [0, 2]), (False, [1, 3])]
    assert same_machine(engines[0]) and not same_machine(engines[1])
    # an engine that reported no machine id: by host name, as before
    assert same_machine(EngineInfo(5, 105, name)) and not same_machine(EngineInfo(6, 106, "elsewhere"))


# -- every copy counted -------------------------------------------------------------------
class _Result:
    def __init__(self, value):
        self.value = value


class _Engine:
    """An engine of another machine that answers host_room with what the test says."""

    def __init__(self, free, segments):
        self.free, self.segments, self.asked = free, segments, []

    def apply_async(self, f, *args):
        self.asked.append((f.__name__, args))
        return _Result((self.free, self.segments))


class _Cluster:
    def __init__(self, engines, remote):
        self.engines, self.client = engines, remote


def _plan(engines, value):
    plan = push.Plan(push.group(engines), {"x": value}, {"x": "p"})
    plan.needs = {"x": {e.engine_id for e in engines}}
    return plan


@pytest.fixture
def answers(monkeypatch):
    monkeypatch.setattr(push.waiting, "gather", lambda s, ars, *a, **k: [ar.value for ar in ars])


def test_another_machines_free_memory_is_asked_before_anything_is_sent(answers):
    x = np.zeros(2**18)  # 2 MiB
    far = [EngineInfo(i, 200 + i, "far", "far/b/1") for i in range(3)]
    first = _Engine(free=3 * 2**20, segments=True)  # room for its copy, not for two
    cluster = _Cluster(far, {0: first})
    with pytest.raises(KDistError) as info:
        push._count(None, cluster, _plan(far, x), [0, 1, 2])
    said = str(info.value)
    assert first.asked == [("host_room", (2**21,))]
    assert "host far" in said and "4 MiB" in said and "3 MiB" in said and "\n" not in said
    assert said.endswith("Nothing was sent")
    # with room for the two copies (the one that came and the segment's), it goes ahead
    first.free = 5 * 2**20
    plan = _plan(far, x)
    push._count(None, cluster, plan, [0, 1, 2])
    assert plan.hosts[0].need == 2 * 2**21 and plan.hosts[0].segments


def test_no_shared_memory_there_counts_one_copy_per_engine(answers):
    x = np.zeros(2**18)
    far = [EngineInfo(i, 200 + i, "far", "far/b/1") for i in range(3)]
    cluster = _Cluster(far, {0: _Engine(free=5 * 2**20, segments=False)})
    with pytest.raises(KDistError) as info:
        push._count(None, cluster, _plan(far, x), [0, 1, 2])
    assert "3 copies (one per engine there)" in str(info.value) and "6 MiB" in str(info.value)


def test_this_machine_without_room_in_dev_shm_counts_a_copy_per_engine(answers, monkeypatch, capsys):
    import psutil

    x = np.zeros(2**18)
    near = [EngineInfo(i, 300 + i, "here", machine_id()) for i in range(4)]
    monkeypatch.setattr(shared, "room", lambda nbytes, folder="/dev/shm": 1024)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("M", (), {"available": 7 * 2**20})())
    with pytest.raises(KDistError) as info:
        push._count(None, _Cluster(near, {}), _plan(near, x), [0, 1, 2, 3])
    assert "this host" in str(info.value) and "4 copies" in str(info.value)
    assert "/dev/shm has 0 MiB free" in capsys.readouterr().out  # and why, in one line
    monkeypatch.setattr(shared, "room", lambda nbytes, folder="/dev/shm": None)
    plan = _plan(near, x)
    push._count(None, _Cluster(near, {}), plan, [0, 1, 2, 3])  # one shared copy fits
    assert plan.hosts[0].need == 2**21 and plan.hosts[0].segments


def test_an_unchanged_value_costs_no_memory(answers, monkeypatch):
    import psutil

    near = [EngineInfo(0, 300, "here", machine_id())]
    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("M", (), {"available": 1})())
    plan = _plan(near, np.zeros(2**18))
    plan.needs = {}  # every engine holds it
    push._count(None, _Cluster(near, {}), plan, [0])
    assert plan.hosts[0].need == 0
