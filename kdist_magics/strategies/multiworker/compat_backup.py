"""Keras 3's ``BackupAndRestore`` under several workers: only the chief's backup is kept.

Keras 3 (3.13 to 3.15.1) ``keras.callbacks.BackupAndRestore`` knows nothing of workers: every
worker of a ``MultiWorkerMirroredStrategy`` writes the same ``latest.weights.h5`` and
``training_metadata.json`` after each epoch, in step with the others, and every one removes the
folder when ``fit`` ends. On one host, or a shared filesystem, those writes race: HDF5 refuses
to create a file another process holds open for writing, and a second ``rmtree`` finds nothing
to remove. Every worker must still save: reading a metric's sync-on-read variable is a
collective, so a worker that skipped the save would leave the others waiting in it (measured:
"Collective instance ... expected type 0 ... but got type 1"). tf.keras 2 had the other workers
save into temporary folders, and TensorFlow's tutorial "Multi-worker training with Keras"
(section "Fault tolerance") relies on that. No upstream issue found for Keras 3 (searched 4 Dec
2026).

While a ``--strategy multiworker`` run is set up on an engine (:func:`install`, by
:mod:`.tf_workers`), worker 0 saves to ``backup_dir`` and removes it when ``fit`` ends; every
other worker saves into a temporary folder of its own, removed at once, and leaves
``backup_dir`` alone. Every worker reads ``backup_dir`` when ``fit`` begins: after each step
the workers' weights are the same (that is what the all-reduce does), so the chief's backup is
every worker's. Outside kdist runs nothing is patched.
"""

from __future__ import annotations

import shutil
import tempfile
import threading

_lock = threading.Lock()
_state: dict = {"chief": True, "originals": None}
#: the callback's attributes that name files under ``backup_dir`` (Keras 3.13 to 3.15)
PATHS = ("backup_dir", "_weights_path", "_training_metadata_path", "_prev_weights_path", "_prev_training_metadata_path")


def _callback_class():
    try:
        from keras.src.callbacks.backup_and_restore import BackupAndRestore
    except ImportError:
        return None
    if not all(hasattr(BackupAndRestore, name) for name in ("_save_model", "on_train_end")):
        return None  # another Keras: leave it alone
    return BackupAndRestore


def _save_elsewhere(callback, save) -> None:
    """``save(callback)`` with every path moved from ``backup_dir`` into a new temporary
    folder, which is removed afterwards (the callback's own paths are put back)."""
    own = {name: getattr(callback, name, None) for name in PATHS}
    base = str(own["backup_dir"])
    temp = tempfile.mkdtemp(prefix="kdist-backup-")
    try:
        for name, path in own.items():
            if isinstance(path, str) and path.startswith(base):
                setattr(callback, name, temp + path[len(base) :])
        save(callback)
    finally:
        for name, path in own.items():
            setattr(callback, name, path)
        shutil.rmtree(temp, ignore_errors=True)


def install(chief: bool) -> bool:
    """From now on only the chief's backup is kept (this process is the chief when ``chief``).
    Returns whether the patch is in place."""
    with _lock:
        cls = _callback_class()
        if cls is None:
            return False
        _state["chief"] = chief
        if _state["originals"] is None:
            save, end = cls._save_model, cls.on_train_end
            _state["originals"] = (save, end)

            def _save_model(self):
                if _state["chief"]:
                    return save(self)
                return _save_elsewhere(self, save)

            def on_train_end(self, logs=None):
                if _state["chief"]:
                    return end(self, logs)

            cls._save_model, cls.on_train_end = _save_model, on_train_end
        return True


def uninstall() -> None:
    """Keras' own methods back (idempotent)."""
    with _lock:
        originals, _state["originals"] = _state["originals"], None
        cls = _callback_class()
        if originals is not None and cls is not None:
            cls._save_model, cls.on_train_end = originals
        _state["chief"] = True


__all__ = ["install", "uninstall", "PATHS"]
