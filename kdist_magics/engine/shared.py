"""``--push`` through shared memory: one copy of a NumPy array per host, nothing sent twice.

Both sides of one protocol. In the kernel, :mod:`kdist_magics.strategies.engines.push` copies
each large array of a pushed value once into a POSIX shared-memory segment and sends every
engine on this host only a small description (:func:`describe`); each engine maps the segment
copy-on-write (:func:`attach`: its cell reads the one copy, and a write gives that engine a
private copy of the page it writes, never changing the others'), and once every engine has
mapped it the kernel removes its name, so nothing stays in ``/dev/shm`` whatever ends later:
the memory goes when the last process that maps it ends. An unchanged value pushed again (the
same :func:`fingerprint`) is bound again from what each engine holds (:func:`rebind`), after
the engine checked that its copy is unchanged too.

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
    import numpy as np

    return isinstance(value, np.ndarray) and not value.dtype.hasobject and value.nbytes >= MIN_BYTES


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
    if isinstance(value, (tuple, list)):
        return any(shareable(v) for v in value)
    if isinstance(value, dict):
        return any(shareable(v) for v in value.values())
    return False


def fingerprint(value) -> str:
    """A digest of ``value``'s arrays' shapes, types and every byte, in one fast pass: blocks of
    4 KiB are summed as 64-bit words and the block sums weighted by position, so a change
    anywhere, or rows moved (a shuffle in place), changes it."""
    import hashlib

    import numpy as np

    digest = hashlib.blake2b(digest_size=16)

    def add(v) -> None:
        if isinstance(v, np.ndarray) and not v.dtype.hasobject:
            digest.update(f"a{v.shape}{v.dtype.str}".encode())
            raw = np.ascontiguousarray(v).reshape(-1).view(np.uint8)
            words = raw[: raw.size // 4096 * 4096].view(np.uint64).reshape(-1, 512)
            blocks = words.sum(axis=1, dtype=np.uint64)
            weights = np.arange(1, blocks.size + 1, dtype=np.uint64)
            digest.update(np.array([blocks.sum(dtype=np.uint64),
                                    (blocks * weights).sum(dtype=np.uint64)]).tobytes())
            digest.update(raw[raw.size // 4096 * 4096:].tobytes())
        elif (columns := frame_columns(v)) is not None:
            import pickle

            digest.update(b"frame" + pickle.dumps(v.index, protocol=5))
            for name, column in columns:
                digest.update(repr(name).encode())
                add(column)
        elif isinstance(v, (tuple, list)):
            digest.update(f"{type(v).__name__}{len(v)}".encode())
            for item in v:
                add(item)
        elif isinstance(v, dict):
            digest.update(f"d{len(v)}".encode())
            for key, item in v.items():
                digest.update(repr(key).encode())
                add(item)
        elif v is None or isinstance(v, (bool, int, float, complex, str, bytes)):
            digest.update(f"{type(v).__name__}{v!r}".encode())
        else:  # another object inside a shared structure: by its pickled bytes
            import pickle

            digest.update(pickle.dumps(v, protocol=5))
    add(value)
    return digest.hexdigest()


def describe(value, segment) -> Any:
    """The travelling description of ``value``: each large array copied into a new segment
    (``segment(nbytes) -> (name, writable buffer)``), anything else inline."""
    import numpy as np

    if segment_worthy(value):
        name, buffer = segment(value.nbytes)
        np.frombuffer(buffer, dtype=value.dtype, count=value.size).reshape(value.shape)[...] = value
        return ("array", name, value.shape, value.dtype.str, value.nbytes)
    columns = frame_columns(value)
    if columns is not None:
        return ("frame", [(k, describe(np.ascontiguousarray(a), segment)) for k, a in columns],
                value.index)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, [describe(v, segment) for v in value])
    if isinstance(value, dict):
        return ("dict", [(k, describe(v, segment)) for k, v in value.items()])
    return ("value", value)


def _build(desc) -> Any:
    import numpy as np

    kind = desc[0]
    if kind == "array":
        _, name, shape, dtype, nbytes = desc
        fd = os.open(os.path.join("/dev/shm", name.lstrip("/")), os.O_RDONLY)
        try:
            mapped = mmap.mmap(fd, nbytes, access=mmap.ACCESS_COPY)  # copy-on-write
        finally:
            os.close(fd)
        return np.frombuffer(mapped, dtype=np.dtype(dtype)).reshape(shape)
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
    import numpy as np

    if isinstance(value, np.ndarray):
        return [value]
    columns = frame_columns(value)
    if columns is not None:
        return [a for _, a in columns]
    if isinstance(value, (tuple, list)):
        return [a for v in value for a in arrays(v)]
    if isinstance(value, dict):
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

    mem = shared_memory.SharedMemory(create=True, size=nbytes,
                                     name=f"kdist-{os.getpid()}-{os.urandom(4).hex()}")
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
