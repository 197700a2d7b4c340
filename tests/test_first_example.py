"""The README's first example, as a new user meets it: its code blocks, pasted one by one
into a fresh kernel in an empty folder, train to a finished run on 2 replicas; the Horovod
example after it, on 2 ranks. The getting-started page shows the same code.

Fast tier: the blocks are found, the getting-started page has them word for word.
Kernel tier: the first example runs (TensorFlow, no engines). Engine tier: the Horovod one.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from conftest import run_in_fresh_shell

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```python\n(.*?)^```", re.M | re.S)


def front_blocks(text: str) -> list[str]:
    """The python code blocks before the page's first ``## `` heading."""
    head = text[: text.index("\n## ")] if "\n## " in text else text
    return [m.group(1) for m in FENCE.finditer(head)]


def examples(text: str) -> tuple[list[str], list[str]]:
    """(first example, Horovod example): the blocks before the first Horovod cell, the rest."""
    blocks = front_blocks(text)
    split = next(i for i, b in enumerate(blocks) if re.search(r"%%kdist.*--strategy horovod", b))
    return blocks[:split], blocks[split:]


README = (ROOT / "README.md").read_text()
FIRST, HOROVOD = examples(README)


def test_readme_starts_with_a_complete_example_that_needs_no_horovod():
    cells = "\n".join(FIRST)
    assert FIRST[0].strip() == "%load_ext kdist_magics"
    assert "%%kdist --strategy mirrored --devices 2" in cells and "horovod" not in cells.lower()
    # complete: the data and the model are defined in the blocks themselves
    assert "load_digits_split" in cells and "keras.Sequential" in cells
    assert HOROVOD and "--push x_train,y_train" in HOROVOD[0] and HOROVOD[-1].strip() == "%kdist stop"


def test_getting_started_shows_the_readme_example():
    page = (ROOT / "docs" / "getting-started.md").read_text()
    blocks = [m.group(1) for m in FENCE.finditer(page)]
    missing = [b for b in FIRST + HOROVOD if b not in blocks]
    assert not missing, f"docs/getting-started.md lacks the README's blocks: {missing}"


RUN_BLOCKS = """
import os, tempfile
os.chdir(tempfile.mkdtemp(prefix="kdist-readme-"))  # an empty folder, nothing next to it
out["failed"] = []
for block in json.loads(os.environ["KD_BLOCKS"]):
    result = ip.run_cell(block, store_history=False)
    if not result.success:
        out["failed"].append(block)
run = kdist_magics.last_run()
out.update(strategy=run.strategy, status=run.status, ranks=sorted(run.ranks), files=os.listdir("."))
"""


def _env(blocks: list[str]) -> dict:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return dict(KD_BLOCKS=json.dumps(blocks), PYTHONPATH=path, KERAS_BACKEND="tensorflow")


@pytest.mark.kernel
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_readme_first_example_trains_on_two_replicas():
    check = """
import numpy as np
ns = ip.user_ns
copies = ns["strategy"].experimental_local_results(ns["model"].layers[0].kernel.value)
out["copies"] = len(copies)
out["equal"] = all(np.array_equal(copies[0].numpy(), c.numpy()) for c in copies)
"""
    out = run_in_fresh_shell(RUN_BLOCKS + check, _env(FIRST))
    assert out["failed"] == [], out["_stdout"][-3000:]
    assert (out["strategy"], out["status"], out["ranks"]) == ("mirrored", "done", [0, 1])
    assert out["copies"] == 2 and out["equal"], "the 2 replicas' weights differ after training"
    assert "replicas in sync: 2" in out["_stdout"]


@pytest.mark.engines
@pytest.mark.horovod
@pytest.mark.slow
@pytest.mark.timeout(500)
def test_readme_horovod_example_trains_on_two_ranks():
    import importlib.util

    if importlib.util.find_spec("horovod") is None:
        pytest.skip("Horovod is not built in this environment (python -m kdist_magics.strategies.horovod.build)")
    blocks = FIRST[:2] + HOROVOD[:-1]  # the data, then the Horovod cell; stop after the check
    check = "out['weights'] = [[w.tolist() for w in v] for v in by_rank_weights()]; ip.run_line_magic('kdist', 'stop')"
    body = (
        RUN_BLOCKS
        + """
def by_rank_weights():
    ip.run_cell_magic("kdist", "--strategy horovod --np 2 --no-dashboard --out none",
                      "kd_w = model.get_weights()")
    return by_rank("kd_w", "horovod")
"""
        + check
        + "\n"
    )
    out = run_in_fresh_shell(body, _env(blocks))
    assert out["failed"] == [], out["_stdout"][-3000:]
    assert (out["strategy"], out["status"], out["ranks"]) == ("horovod", "done", [0, 1])
    first, second = out["weights"]
    assert first == second, "the 2 ranks' weights differ after training"
