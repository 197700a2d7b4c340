"""``--push`` through shared memory: one copy of a NumPy array per host, nothing sent twice.

Both sides of one protocol. In the kernel, :mod:`kdist_magics.strategies.engines.push` copies
each large array of a pushed value once into a POSIX shared-memory segment and sends every
engine on this host only a small description (:func:`describe`); each engine maps the segment
copy-on-write (:func:`attach`: its cell reads the one copy, and a write gives that engine a
private copy of the page it writes, never changing the others'), and once every engine has
mapped it the kernel removes its name, so nothing stays in ``/dev/shm`` whatever ends later:
the memory goes when the last process that maps it ends. An unchanged value pushed again (the
same :func:`fingerprint`, XXH3-128 of every byte) is bound again from what each engine holds
(:func:`rebind`), after the engine checked that its copy is unchanged too (its pages unwritten,
else its fingerprint). A changed value replaces the held one, whose mapping goes with it.

pandas DataFrames whose columns are plain NumPy arrays travel column by column the same way
(the frame is rebuilt on the engine around the mapped columns, without a copy). Values that
are not arrays (or arrays under :data:`MIN_BYTES`) travel as ``--push`` always sent them. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

#: arrays smaller than this travel inline (a segment costs more than it saves)
MIN_BYTES = 1 << 20
#: what each engine holds: name -> (fingerprint, value)
HELD: dict[str, tuple[str, Any]] = {}


def segment_worthy(value) -> bool:
    """An array that travels through a segment: NumPy, no Python objects, :data:`MIN_BYTES` up."""

    return plain_array(value) and value.nbytes >= MIN_BYTES


def segment_bytes(value) -> int:
    """Bytes of ``value``'s arrays that travel through segments (:func:`segment_worthy`)."""
    return sum(a.nbytes for a in arrays(value) if segment_worthy(a))


def frame_columns(value) -> list | None:
    """A pandas ``DataFrame`` whose every column is a plain NumPy array (numbers, booleans,
    datetimes; no objects, strings or categories): its ``(name, array)`` pairs; else None.
    Each column travels as an array (one segment each where large); the index inline."""
    if type(value).__name__ != "DataFrame" or not type(value).__module__.startswith("pandas"):
        return None
    if not value.columns.is_unique:  # a repeated name selects several columns at once
        return None
    import numpy as np

    columns = []
    for name, dtype in value.dtypes.items():
        if not isinstance(dtype, np.dtype) or dtype.hasobject:
            return None
        columns.append((name, value[name].to_numpy()))
    return columns


def shareable(value) -> bool:
    """Whether ``value`` is, or holds (tuples, lists, dicts), an array worth a segment (a
    DataFrame's columns count as arrays)."""
    if segment_worthy(value):
        return True
    columns = frame_columns(value)
    if columns is not None:
        return any(segment_worthy(a) for _, a in columns)
    if type(value) in (tuple, list):
        return any(shareable(v) for v in value)
    if type(value) is dict:
        return any(shareable(v) for v in value.values())
    return False


def _array_header(v) -> bytes:
    """What an array is besides its bytes: shape, dtype (fields and byte order included) and
    memory order (C, Fortran, or neither)."""
    order = "C" if v.flags.c_contiguous else "F" if v.flags.f_contiguous else "A"
    return f"a{v.shape}{v.dtype.str}{v.dtype.descr!r}{order}".encode()


def _array_bytes(v):
    """``v``'s bytes in its own memory order without a copy where it is contiguous (a Fortran
    array through its transpose); a strided view is copied once."""
    import numpy as np

    if v.flags.c_contiguous:
        return memoryview(v.reshape(-1).view(np.uint8))
    if v.flags.f_contiguous:
        return memoryview(v.T.reshape(-1).view(np.uint8))
    return memoryview(np.ascontiguousarray(v).reshape(-1).view(np.uint8))


def plain_array(value) -> bool:
    """A NumPy array itself, not a subclass (a masked array or a matrix carries more than its
    bytes: those travel pickled, and their fingerprint is their pickle)."""
    import numpy as np

    return type(value) is np.ndarray and not value.dtype.hasobject


def fingerprint(value) -> str:
    """XXH3-128 of ``value``: every byte of its arrays with their shape, dtype and memory
    order, and the structure around them (tuples, lists, dicts, a DataFrame's index and
    columns; anything else by its pickle). Two values with one fingerprint are equal short of
    a 128-bit hash collision, so ``--push`` skips a value only when it is unchanged: a sort in
    place, a swap, paired edits that cancel, one flipped bit each change it. About 10 GB/s on
    one core (XXH3 reads memory about as fast as it streams)."""
    import pickle

    import xxhash

    digest = xxhash.xxh3_128()

    def add(v) -> None:
        if plain_array(v):
            digest.update(_array_header(v))
            digest.update(_array_bytes(v))
        elif (columns := frame_columns(v)) is not None:
            digest.update(b"frame" + pickle.dumps(v.index, protocol=5))
            for name, column in columns:
                digest.update(repr(name).encode())
                add(column)
        elif type(v) in (tuple, list):
            digest.update(f"{type(v).__name__}{len(v)}".encode())
            for item in v:
                add(item)
        elif type(v) is dict:
            digest.update(f"d{len(v)}".encode())
            for key, item in v.items():
                digest.update(repr(key).encode())
                add(item)
        elif v is None or type(v) in (bool, int, float, complex, str, bytes):
            digest.update(f"{type(v).__name__}{v!r}".encode())
        else:  # any other object (an array subclass too): its pickled bytes, length-prefixed
            try:
                data = pickle.dumps(v, protocol=5)
            except Exception:  # no pickle to compare: never taken for unchanged
                data = os.urandom(16)
            digest.update(f"p{len(data)}".encode())
            digest.update(data)

    add(value)
    return digest.hexdigest()


def describe(value, segment) -> Any:
    """The travelling description of ``value``: each large array copied into a new segment
    (``segment(nbytes) -> (name, writable buffer)``), anything else inline."""
    import numpy as np

    if segment_worthy(value):
        name, buffer = segment(value.nbytes)
        order = "F" if value.flags.f_contiguous and not value.flags.c_contiguous else "C"
        target = np.frombuffer(buffer, dtype=value.dtype, count=value.size)
        target.reshape(value.shape, order=order)[...] = value  # its own memory order kept
        return ("array", name, value.shape, value.dtype, value.nbytes, order)
    columns = frame_columns(value)
    if columns is not None:
        return ("frame", [(k, describe(np.ascontiguousarray(a), segment)) for k, a in columns], value.index)
    if type(value) in (tuple, list):
        return (type(value).__name__, [describe(v, segment) for v in value])
    if type(value) is dict:
        return ("dict", [(k, describe(v, segment)) for k, v in value.items()])
    return ("value", value)


def _build(desc) -> Any:
    import numpy as np

    kind = desc[0]
    if kind == "array":
        _, name, shape, dtype, nbytes, order = desc
        fd = os.open(os.path.join("/dev/shm", name.lstrip("/")), os.O_RDONLY)
        try:
            mapped = mmap.mmap(fd, nbytes, access=mmap.ACCESS_COPY)  # copy-on-write
        finally:
            os.close(fd)
        count = nbytes // max(np.dtype(dtype).itemsize, 1)
        return np.frombuffer(mapped, dtype=np.dtype(dtype), count=count).reshape(shape, order=order)
    if kind in ("tuple", "list"):
        items = [_build(d) for d in desc[1]]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict":
        return {k: _build(d) for k, d in desc[1]}
    if kind == "frame":  # the columns stay on the mapped pages (no copy, no consolidation)
        import pandas as pd

        return pd.DataFrame({k: _build(d) for k, d in desc[1]}, index=desc[2], copy=False)
    return desc[1]


def arrays(value) -> list:
    """Every NumPy array in ``value`` (itself, or in its tuples, lists and dicts)."""

    if plain_array(value):
        return [value]
    columns = frame_columns(value)
    if columns is not None:
        return [a for _, a in columns]
    if type(value) in (tuple, list):
        return [a for v in value for a in arrays(v)]
    if type(value) is dict:
        return [a for v in value.values() for a in arrays(v)]
    return []


def written(array) -> bool | None:
    """Whether this process wrote to a copy-on-write mapped ``array`` since it was mapped: a
    page of it that is present and no longer the segment's own (``/proc/self/pagemap``: bit 63
    present, bit 61 file-page or shared); None where that cannot be read (then the caller
    reads the content). A few milliseconds for a GiB, where reading the content takes ~0.1 s."""
    import numpy as np

    page = mmap.PAGESIZE
    start = array.__array_interface__["data"][0]
    first, last = start // page, (start + array.nbytes - 1) // page
    try:
        with open("/proc/self/pagemap", "rb") as f:
            f.seek(first * 8)
            entries = np.frombuffer(f.read((last - first + 1) * 8), dtype=np.uint64)
    except OSError:
        return None
    if entries.size != last - first + 1:
        return None
    present = (entries >> np.uint64(63)) & np.uint64(1)
    shared = (entries >> np.uint64(61)) & np.uint64(1)
    swapped = (entries >> np.uint64(62)) & np.uint64(1)
    return bool(((present & (shared ^ np.uint64(1))) | swapped).any())


def _unchanged(held: tuple) -> bool:
    """An engine's held value as it was when mapped (its pages; else its content)."""
    print_, value = held
    checks = [written(a) for a in arrays(value) if segment_worthy(a)]
    if checks and all(c is False for c in checks):
        return True
    return fingerprint(value) == print_


def attach(name: str, desc, print_: str) -> None:  # runs on an engine
    """Bind ``name`` in this engine's namespace to the value ``desc`` describes, mapping its
    segments; held for :func:`rebind` under fingerprint ``print_``."""
    from IPython import get_ipython

    value = _build(desc)
    HELD[name] = (print_, value)
    get_ipython().user_ns[name] = value


#: segments this engine made for the others on its host (:func:`host_share`), until :func:`unname`
MADE: list = []


def room(nbytes: int, folder: str = "/dev/shm") -> int | None:
    """Bytes free in ``folder`` where fewer than ``nbytes`` (and a 5 % margin) are (a segment
    written past a full tmpfs kills its writer with SIGBUS); None where they fit."""
    try:
        stat = os.statvfs(folder)
    except OSError:
        return 0
    free = stat.f_bavail * stat.f_frsize
    return None if free >= nbytes * 1.05 else free


def new_segment(made: list, nbytes: int):
    """A new named segment of ``nbytes`` (``kdist-<this pid>-<random>``), kept in ``made``:
    its name and writable buffer, as :func:`describe` takes them."""
    from multiprocessing import shared_memory

    mem = shared_memory.SharedMemory(create=True, size=nbytes, name=f"kdist-{os.getpid()}-{os.urandom(4).hex()}")
    made.append(mem)
    return mem.name, mem.buf


def drop(mem) -> None:
    """Close this process's mapping of a segment it made and remove its name, whatever it holds
    (the memory stays while another process maps it)."""
    try:
        mem.close()
    except BufferError:  # a NumPy view of it still alive here: the mapping goes with it
        pass
    try:
        mem.unlink()
    except FileNotFoundError:
        pass


def host_share(name: str, value, print_: str, others: bool):  # runs on an engine
    """On another host's first engine, which got ``value`` in the push's one transfer there:
    bind it; where other engines on this host are to map it, copy its large arrays into
    segments named here (``kdist-<this pid>-*``) and return their description (None where there
    is nobody to share with, or no ``/dev/shm`` or no room in it: then the value is bound as it
    came, and the others get it as ipyparallel sends it)."""
    if not others or not os.path.isdir("/dev/shm") or room(segment_bytes(value)) is not None:
        HELD[name] = (print_, value)
        from IPython import get_ipython

        get_ipython().user_ns[name] = value
        return None
    desc = describe(value, lambda nbytes: new_segment(MADE, nbytes))
    del value  # the copy that came: this engine maps the segments like the others
    attach(name, desc, print_)
    return desc


def host_room(nbytes: int) -> tuple[int, bool]:  # runs on an engine
    """This machine's free memory (bytes) and whether its ``/dev/shm`` takes ``nbytes`` more:
    asked before a push sends anything here."""
    import psutil

    return psutil.virtual_memory().available, os.path.isdir("/dev/shm") and room(nbytes) is None


def hold_as_sent(name: str, print_: str) -> None:  # runs on an engine
    """Hold the value ``name`` that came as a copy of its own (no shared memory) under
    fingerprint ``print_``, so an unchanged push binds it again (its content is checked)."""
    from IPython import get_ipython

    HELD[name] = (print_, get_ipython().user_ns[name])


def unname() -> None:  # runs on an engine
    """Remove the names of the segments :func:`host_share` made (every engine here has mapped
    them) and this engine's writable mapping of them; the memory stays while mapped."""
    while MADE:
        drop(MADE.pop())


def rebind(names_prints: dict[str, str]) -> list[str]:  # runs on an engine
    """Bind each name again from what this engine holds where its fingerprint is the one given
    and its copy is unchanged (a cell may have written to it); the names it could not."""
    from IPython import get_ipython

    ns, missing = get_ipython().user_ns, []
    for name, print_ in names_prints.items():
        held = HELD.get(name)
        if held is None or held[0] != print_ or not _unchanged(held):
            HELD.pop(name, None)
            missing.append(name)
        else:
            ns[name] = held[1]
    return missing


def forget() -> None:  # runs on an engine
    """Drop what this engine holds (its mappings go with the last reference)."""
    HELD.clear()
