"""``--checkpoint DIR``: rank 0's ``DIR/last.keras`` is written atomically, so a Stop in the middle
of a save leaves the previous epoch's checkpoint loadable (seen through a real kernel: a SIGINT
during Keras' save left a truncated archive that ``load_model`` refused)."""

from __future__ import annotations

import numpy as np
import pytest

keras = pytest.importorskip("keras", reason="Keras is installed by `make test`'s set-up")

from kdist_magics.rank.lifecycle import _checkpointing  # noqa: E402

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(300)]


def test_checkpoint_survives_an_interrupted_save(tmp_path, monkeypatch):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    x, y = np.ones((8, 3), "float32"), np.ones(8, "float32")
    with _checkpointing(str(tmp_path)):
        model.fit(x, y, epochs=2, verbose=0)
    assert [p.name for p in tmp_path.iterdir()] == ["last.keras"]
    good = keras.saving.load_model(tmp_path / "last.keras").get_weights()

    def interrupted_save(self, path, *args, **kwargs):  # the Stop button mid-write
        with open(path, "wb") as f:
            f.write(b"PK\x03\x04 half an archive")
        raise KeyboardInterrupt

    monkeypatch.setattr(keras.Model, "save", interrupted_save)
    with pytest.raises(KeyboardInterrupt):
        with _checkpointing(str(tmp_path)):
            model.fit(x, y, epochs=1, verbose=0)
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["last.keras"]  # no partial file left either
    kept = keras.saving.load_model(tmp_path / "last.keras").get_weights()
    for a, b in zip(good, kept):
        np.testing.assert_array_equal(a, b)
