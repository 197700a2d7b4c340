"""The teaching notebooks and the binder set-up.

Fast tier: committed notebooks carry no outputs; ``binder/`` follows
repo2docker's rules and agrees with pyproject.toml's pins.

Notebook tier (``-m notebook``): every ``notebooks/*.ipynb`` runs top to bottom
with nbclient, copied alone into an empty temp folder (as a notebook opened from a
link, a download or Colab is: the package is installed, nothing else is next to
it), with its own IPYTHONDIR
and Jupyter dirs, on the venv's own ``python3`` kernel. The executed copy is saved
under ``test-output/notebooks/``; a failing cell fails the test with that cell's
source and error in the message.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
BINDER = ROOT / "binder"
PAPERS = sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))
CELL_TIMEOUT = 300  # seconds for one cell; the notebooks take far less here
#: notebooks that need no TensorFlow as they are: they run on Colab's TPU pins too (marker notf)
WITHOUT_TENSORFLOW = {
    "04-colab-tpu",
    "07-keras-on-jax-across-engines",
    "09-a-model-too-big-for-one-device",
    "10-will-more-devices-help",
}
#: ... of which these run there only (marker tfless): Keras on torch, no TensorFlow needed, and
#: the main suite's time is spent elsewhere (tests/README.md)
ONLY_WITHOUT_TENSORFLOW = {"10-will-more-devices-help"}
#: notebooks that start a Ray head (marker ray): with the Ray tier, in .venv (Ray is not on
#: Colab's stack)
ON_RAY = {"11-on-a-ray-cluster"}


def _nb_id(path: Path) -> str:
    return path.stem


def _runs() -> list:
    """(notebook, env) pairs: each notebook once as it is, plus once per variant its
    metadata lists (``{"kdist": {"variants": [{"KERAS_BACKEND": "jax"}]}}``)."""
    import json

    runs = []
    for path in PAPERS:
        marks = [pytest.mark.notf] if path.stem in WITHOUT_TENSORFLOW else []
        marks += [pytest.mark.tfless] if path.stem in ONLY_WITHOUT_TENSORFLOW else []
        marks += [pytest.mark.ray] if path.stem in ON_RAY else []
        runs.append(pytest.param(path, {}, id=path.stem, marks=marks))
        meta = json.loads(path.read_text()).get("metadata", {})
        for env in meta.get("kdist", {}).get("variants", []):
            label = ",".join(f"{k}={v}" for k, v in env.items())
            runs.append(pytest.param(path, dict(env), id=f"{path.stem}[{label}]"))
    return runs


# -- fast tier: notebooks are committed clean -----------------------------------


def test_there_are_notebooks():
    assert PAPERS, "notebooks/ has no numbered notebooks"
    assert (NOTEBOOKS / "01-quickstart.ipynb") in PAPERS


@pytest.mark.parametrize("path", PAPERS, ids=_nb_id)
def test_committed_notebook_is_valid_and_has_no_outputs(path):
    import nbformat

    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3", (
        f"{path.name}: kernelspec must be the standard python3 kernel"
    )
    dirty = [
        i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count is not None)
    ]
    assert not dirty, (
        f"{path.name}: cells {dirty} have outputs; "
        f"strip them with: python scripts/strip_outputs.py {path.relative_to(ROOT)}"
    )
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# "), (
        f"{path.name}: the first cell should be a markdown title"
    )


@pytest.mark.parametrize("path", PAPERS, ids=_nb_id)
def test_notebook_stops_what_it_starts(path):
    """Notebooks that start engines end with %kdist stop; --devices comes before any TF use."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    text = "\n".join(code)
    if re.search(r"--strategy\s+(horovod|multiworker)|-s\s+(horovod|multiworker)", text):
        assert any(src.strip() == "%kdist stop" for src in code), (
            f"{path.name} starts engines but never runs %kdist stop"
        )
    first_devices = next((i for i, src in enumerate(code) if "--devices" in src), None)
    if first_devices is not None:
        tf_use = re.compile(r"^\s*(import tensorflow|from tensorflow|import keras|from keras)", re.M)
        early = [i for i, src in enumerate(code[:first_devices]) if tf_use.search(src)]
        early += [i for i, src in enumerate(code[:first_devices]) if src.lstrip().startswith("%%kdist")]
        assert not early, (
            f"{path.name}: code cells {early} use TensorFlow before the first "
            f"--devices cell; TF fixes its devices when it starts"
        )


def _check_args(source: str) -> list[str]:
    import ast

    from IPython.core.inputtransformer2 import TransformerManager

    for node in ast.walk(ast.parse(TransformerManager().transform_cell(source))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "check":
            return [a.value for a in node.args if isinstance(a, ast.Constant)]
    return []


@pytest.mark.parametrize("path", PAPERS, ids=_nb_id)
def test_first_code_cell_checks_prerequisites(path):
    """Before any training cell: what is missing is named, with the command that fixes it
    (kdist_magics.prerequisites); notebooks with an Open in Colab link install kdist there."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code").source
    assert "from kdist_magics.prerequisites import check" in first, f"{path.name}: no check first"
    needs = _check_args(first)
    if "kdist_magics.datasets" in "".join(c.source for c in nb.cells):
        assert "sklearn" in needs, f"{path.name}: its data (kdist_magics.datasets) needs scikit-learn"
    if _uses_horovod(path):
        assert "horovod" in needs, f"{path.name} runs Horovod: its first cell must check it is built"
    if _uses_torch(path):
        assert "torch" in needs, f"{path.name} runs Keras on torch: its first cell must check torch"
    title = nb.cells[0].source
    if "colab-badge" in title:
        assert f"colab.research.google.com/github/kdist-magics/kdist_magics/blob/main/notebooks/{path.name}" in title
        assert 'find_spec("kdist_magics") is None' in first and "%pip install" in first
    else:
        assert _uses_horovod(path), f"{path.name}: give it an Open in Colab link (only Horovod's has none)"


INSTALL_LINE = '%pip install -q "kdist_magics @ git+https://github.com/kdist-magics/kdist_magics"'


def test_notebooks_do_not_contradict_each_other():
    """One install line, no hand-silenced TF logs (kdist cells do it), a date only with
    "as of", no retired TPU recommended, and 01's Where next names every other notebook."""
    import nbformat

    quickstart = nbformat.read(NOTEBOOKS / "01-quickstart.ipynb", as_version=4)
    where_next = next(c.source for c in quickstart.cells if c.source.startswith("## Where next"))
    assert [p.stem for p in PAPERS[1:] if f"`{p.stem}`" not in where_next] == []
    for path in PAPERS:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            text = cell.source
            assert not re.search(r"setLevel|TF_CPP_MIN_LOG_LEVEL", text), (
                f"{path.name} silences TensorFlow's logs by hand; kdist cells already do"
            )
            installs = [ln.strip() for ln in text.splitlines() if "pip install" in ln and "kdist_magics" in ln]
            assert all(INSTALL_LINE in ln for ln in installs), f"{path.name}: {installs}"
            for date in re.finditer(
                r"(?:January|February|March|April|May|June|July|August|"
                r"September|October|November|December) 20\d\d",
                text,
            ):
                assert text[max(0, date.start() - 6) : date.start()] == "as of ", (
                    f"{path.name}: a dated claim without 'as of': {text[date.start() - 30 : date.end()]!r}"
                )
            assert '"tpu": "v2-8"' not in text, f"{path.name} describes a TPU v2-8, no longer offered"


def test_readme_tour_lists_every_notebook():
    text = (ROOT / "README.md").read_text()
    tour = text[text.index("## Tour") :]
    tour = tour[: tour.index("\n## ", 1)]
    missing = [p.name for p in PAPERS if f"(notebooks/{p.name})" not in tour]
    assert not missing, f"README's Tour does not link {missing}"


def test_strip_outputs_script(tmp_path):
    import subprocess

    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    cell = new_code_cell(
        "1 + 1", execution_count=3, outputs=[new_output("execute_result", {"text/plain": "2"}, execution_count=3)]
    )
    nb = new_notebook(cells=[cell], metadata={"widgets": {"state": {}}})
    path = tmp_path / "x.ipynb"
    nbformat.write(nb, path)
    script = [sys.executable, str(ROOT / "scripts" / "strip_outputs.py")]
    assert subprocess.run(script + ["--check", str(path)], capture_output=True).returncode == 1
    assert subprocess.run(script + [str(path)], capture_output=True).returncode == 0
    clean = nbformat.read(path, as_version=4)
    assert clean.cells[0].outputs == [] and clean.cells[0].execution_count is None
    assert "widgets" not in clean.metadata and clean.cells[0].source == "1 + 1"
    assert subprocess.run(script + ["--check", str(path)], capture_output=True).returncode == 0


def test_example_data_ships_in_the_package(tmp_path):
    """The notebooks' offline data comes from the package (a notebook opened alone finds it):
    a fixed digits split and an MNIST-shaped file, without importing TF, Keras or JAX."""
    import numpy as np

    from kdist_magics import datasets

    (x_train, y_train), (x_test, y_test) = datasets.load_digits_split()
    assert x_train.shape == (1438, 64) and x_test.shape == (359, 64)
    assert x_train.dtype == np.float32 and 0 <= x_train.min() and x_train.max() <= 1
    assert set(np.unique(y_train)) == set(range(10))
    again = datasets.load_digits_split()
    assert np.array_equal(again[0][0], x_train)  # the same split every time
    (img, _), _ = datasets.load_digits_split(flat=False)
    assert img.shape == (1438, 8, 8, 1)
    path = datasets.mnist_like_file(tmp_path / "data")
    with np.load(path) as f:
        assert f["x_train"].shape == (1438, 28, 28) and f["x_train"].dtype == np.uint8
        assert f["y_test"].shape == (359,) and f["x_test"].max() == 255
    assert datasets.mnist_like_file(tmp_path / "data") == path  # written once, then reused
    assert "1438 examples" in datasets.describe(x_train, y_train)
    assert datasets.gpu_count() >= 0
    assert not (NOTEBOOKS / "kdist_data.py").exists(), "the data lives in the package now"
    # notebook 02 calls gpu_count() before TensorFlow may start: it must not import TF; run
    # from an empty folder, as a notebook opened alone
    import subprocess

    probe = (
        "import sys; from kdist_magics import datasets; datasets.gpu_count(); "
        "datasets.load_digits_split(); "
        "bad = [m for m in ('tensorflow', 'keras', 'jax') if m in sys.modules]; assert not bad, bad"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_example_data_names_the_fix_without_scikit_learn(monkeypatch):
    from kdist_magics import datasets
    from kdist_magics.messages import NO_SKLEARN

    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)  # import fails as if absent
    with pytest.raises(ImportError) as err:
        datasets.load_digits_split()
    assert str(err.value) == NO_SKLEARN and "pip install scikit-learn" in NO_SKLEARN


# -- fast tier: binder follows repo2docker's rules -----------------------------------


def _pyproject():
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _pin(requirements: list[str], name: str) -> str | None:
    for req in requirements:
        m = re.match(rf"^\s*{re.escape(name)}\s*(?:\[[^\]]*\])?\s*([=<>!~].*)?$", req, re.I)
        if m:
            return (m.group(1) or "").split(";")[0].strip()
    return None


def test_binder_files_present():
    for name in ("requirements.txt", "apt.txt", "postBuild", "runtime.txt", "README.md"):
        assert (BINDER / name).is_file(), f"binder/{name} is missing"
    # repo2docker uses binder/ exclusively when it exists: no environment.yml next to
    # requirements.txt (it would win and requirements.txt would be ignored)
    assert not (BINDER / "environment.yml").exists()


def test_binder_runtime_pins_a_supported_python():
    # repo2docker: runtime.txt "python-X.Y" picks the Python version (with requirements.txt)
    runtime = (BINDER / "runtime.txt").read_text().strip()
    assert re.fullmatch(r"python-3\.1[1-3]", runtime), runtime
    assert _pyproject()["project"]["requires-python"] == ">=3.11"


def test_binder_postbuild_is_executable_and_stops_on_errors():
    post = BINDER / "postBuild"
    mode = post.stat().st_mode
    assert mode & stat.S_IXUSR, "binder/postBuild must be executable (git update-index --chmod=+x)"
    lines = post.read_text().splitlines()
    assert lines[0].startswith("#!") and "bash" in lines[0]
    body = [ln.strip() for ln in lines[1:] if ln.strip() and not ln.strip().startswith("#")]
    assert body and re.match(r"set -[a-z]*e", body[0]), "postBuild must start with set -e"
    # the same builder as scripts/setup.sh (patched sdist, Gloo, no MPI), in the kernel's Python
    assert '-m kdist_magics.strategies.horovod.build --python "$PY"' in post.read_text()
    assert "-m kdist_magics.strategies.horovod.build" in (ROOT / "scripts" / "setup.sh").read_text()


def test_binder_apt_has_build_tools():
    # repo2docker: one package per line, "#" starts a comment, names match ^[a-z0-9.+-]+
    pkgs = {ln.partition("#")[0].strip() for ln in (BINDER / "apt.txt").read_text().splitlines()}
    pkgs.discard("")
    assert {"cmake", "g++", "make"} <= pkgs
    assert all(re.fullmatch(r"[a-z0-9.+-]+", p) for p in pkgs), pkgs


def test_binder_requirements_match_pyproject_pins():
    lines = [ln.split("#")[0].strip() for ln in (BINDER / "requirements.txt").read_text().splitlines()]
    lines = [ln for ln in lines if ln]
    extras = _pyproject()["project"]["optional-dependencies"]
    tf = _pin(lines, "tensorflow-cpu")
    assert tf is not None and re.match(r"==2\.(2\d|19)\.", tf), "binder must pin a current TensorFlow (>= 2.19)"
    keras = _pin(lines, "keras")
    assert keras is not None and re.match(r"(==|>=)3\.", keras), "binder must install Keras 3"
    for name in ("ipyparallel", "ipywidgets", "anywidget", "jupyterlab", "scikit-learn", "pandas"):
        assert _pin(lines, name) is not None, f"binder/requirements.txt lacks {name}"
    # the package itself, relative to the repository root (repo2docker runs pip from there)
    local = [ln for ln in lines if re.match(r"^(-e\s+)?\.(\[.*\])?$", ln)]
    assert local, "binder/requirements.txt must install the package itself ('.' or '-e .')"
    wanted = set(re.search(r"\[(.*)\]", local[0]).group(1).split(",")) if "[" in local[0] else set()
    assert {"tensorflow-cpu", "lab"} <= wanted and wanted <= set(extras), (
        f"the package's extras {sorted(wanted)} must exist in pyproject.toml"
    )
    # Horovod is built in postBuild, after TensorFlow (needs --no-build-isolation)
    assert _pin(lines, "horovod") is None


def test_binder_pins_satisfy_pyproject():
    """Every exact pin in binder/requirements.txt parses and meets pyproject.toml's ranges."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = _pyproject()["project"]
    ranges: dict[str, list] = {}
    for req in project["dependencies"] + [r for rs in project["optional-dependencies"].values() for r in rs]:
        r = Requirement(req)
        ranges.setdefault(canonicalize_name(r.name), []).append(r.specifier)
    checked = 0
    for line in (BINDER / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if not line or line.startswith((".", "-")):
            continue
        r = Requirement(line)  # raises on a line pip would not read
        pins = [s.version for s in r.specifier if s.operator == "=="]
        for spec in ranges.get(canonicalize_name(r.name), []):
            for version in pins:
                assert spec.contains(version, prereleases=True), (
                    f"binder pins {r.name}=={version} but pyproject.toml wants {spec}"
                )
                checked += 1
    assert checked >= 3


#: top-level module a notebook imports -> the distribution that installs it
MODULE_DIST = {
    "tensorflow": "tensorflow-cpu",
    "keras": "keras",
    "jax": "jax",
    "torch": "torch",
    "numpy": "numpy",
    "sklearn": "scikit-learn",
    "pandas": "pandas",
    "matplotlib": "matplotlib",
    "ipyparallel": "ipyparallel",
    "IPython": "ipython",
    "ipywidgets": "ipywidgets",
    "psutil": "psutil",
    "kdist_magics": "kdist_magics",
    "horovod": "horovod",
}
#: prerequisites.check() names -> the module they stand for
CHECK_MODULE = {
    "sklearn": "sklearn",
    "tensorflow": "tensorflow",
    "keras": "keras",
    "jax": "jax",
    "torch": "torch",
    "pandas": "pandas",
    "matplotlib": "matplotlib",
    "horovod": "horovod",
}


def _notebook_imports(path: Path) -> set[str]:
    """Top-level modules the notebook's code imports, plus what its check() cell names."""
    import ast

    import nbformat
    from IPython.core.inputtransformer2 import TransformerManager

    found = set()
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        source = cell.source
        if source.startswith("%%"):  # a %%kdist cell: its body is Python
            source = source.partition("\n")[2]
        tree = ast.parse(TransformerManager().transform_cell(source))  # line magics -> calls
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                found.add(node.module.split(".")[0])
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "check":
                found |= {
                    CHECK_MODULE[a.value] for a in node.args if isinstance(a, ast.Constant) and a.value in CHECK_MODULE
                }
    return found - set(sys.stdlib_module_names)


@pytest.mark.parametrize("path", PAPERS, ids=_nb_id)
def test_binder_installs_what_each_notebook_imports(path):
    """Every module a notebook imports is pinned in binder/requirements.txt, comes with the
    package ('.' with its extras), or (Horovod) is built by postBuild."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    lines = [ln.split("#")[0].strip() for ln in (BINDER / "requirements.txt").read_text().splitlines()]
    pinned = {canonicalize_name(Requirement(ln).name) for ln in lines if ln and not ln.startswith((".", "-"))}
    local = next(ln for ln in lines if ln.startswith("."))
    project = _pyproject()["project"]
    extras = re.search(r"\[(.*)\]", local).group(1).split(",")
    shipped = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    shipped |= {canonicalize_name(Requirement(r).name) for e in extras for r in project["optional-dependencies"][e]}
    unknown = sorted(m for m in _notebook_imports(path) if m not in MODULE_DIST)
    assert not unknown, f"{path.name} imports {unknown}: add them to MODULE_DIST and to binder"
    for module in _notebook_imports(path):
        dist = canonicalize_name(MODULE_DIST[module])
        if dist == "horovod":
            assert "-m kdist_magics.strategies.horovod.build" in (BINDER / "postBuild").read_text()
            continue
        assert dist == "kdist-magics" or dist in pinned or dist in shipped, (
            f"{path.name} imports {module}, which binder/requirements.txt does not install"
        )


def test_readme_links_binder():
    text = (ROOT / "README.md").read_text()
    assert "mybinder.org/v2/gh/" in text and "badge_logo.svg" in text


# -- notebook tier: execute every notebook ---------------------------------------

#: what the suite sets for its own kernels and a newcomer's machine does not have; ipykernel
#: (6.x-7.x, iostream.py) forwards the process's own stderr (TensorFlow's C++ lines) into the
#: notebook only where PYTEST_CURRENT_TEST is not set, so no other notebook test sees them
NOT_A_NEWCOMERS = ("TF_CPP_MIN_LOG_LEVEL", "PYTHONWARNINGS", "XLA_FLAGS", "PYTHONUNBUFFERED", "PYTEST_CURRENT_TEST")


def _kernel_env(home: Path, variant: dict[str, str], newcomer: bool = False) -> dict[str, str]:
    from kernel_driver import isolated_env

    # a notebook chooses its own backend; the kernel is the venv's python, also when the
    # test runs from an activated shell
    env = isolated_env(
        home,
        keras_backend=None,
        PYTHONUNBUFFERED="1",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        **variant,
    )
    if newcomer:  # nothing quietened: TensorFlow's C++ lines reach the notebook if kdist lets them
        for name in NOT_A_NEWCOMERS:
            env.pop(name, None)
    return env


def _execute(
    path: Path, out_dir: Path, variant: dict[str, str] | None = None, newcomer: bool = False
) -> tuple[object, Exception | None]:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    home = Path(tempfile.mkdtemp(prefix=f"kdist-nb-{path.stem}-"))
    work = home / "alone"  # only the notebook: whatever it needs comes from the package
    work.mkdir()
    shutil.copy2(path, work / path.name)
    nb = nbformat.read(work / path.name, as_version=4)
    client = NotebookClient(
        nb,
        kernel_name="python3",
        timeout=CELL_TIMEOUT,
        startup_timeout=120,
        allow_errors=False,
        resources={"metadata": {"path": str(work)}},
    )
    # "python3" is the kernelspec ipykernel installs in the venv (sys.prefix/share/jupyter,
    # which the isolated dirs leave on the path); jupyter_client replaces its argv[0]
    # "python" with sys.executable, so the kernel is the venv's own Python
    error = None
    try:
        client.execute(env=_kernel_env(home, variant or {}, newcomer))
    except (CellExecutionError, CellTimeoutError) as exc:
        error = exc
    finally:
        out_dir.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out_dir / _out_name(path, variant))
        shutil.rmtree(home, ignore_errors=True)
    return nb, error


def _uses_horovod(path: Path) -> bool:
    import nbformat

    code = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
    return re.search(r"%%kdist[^\n]*(--strategy|-s)\s+horovod", code) is not None


def _uses_torch(path: Path) -> bool:
    import nbformat

    code = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
    return re.search(r"KERAS_BACKEND\"\]\s*=\s*\"torch\"", code) is not None


def _out_name(path: Path, variant: dict[str, str] | None) -> str:
    suffix = "".join(f"-{k}={v}" for k, v in (variant or {}).items())
    return f"{path.stem}{suffix}.ipynb"


def _failed_cell(nb) -> tuple[int, str]:
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or "raises-exception" in cell.metadata.get("tags", []):
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                return i, cell.source
    return -1, ""


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(("path", "variant"), _runs())
def test_notebook_runs_top_to_bottom(path, variant, test_output):
    import importlib.util

    if _uses_horovod(path) and importlib.util.find_spec("horovod") is None:
        pytest.skip(
            f"{path.name} runs --strategy horovod, and Horovod is not installed in this "
            f"environment (the Colab-pinned one has none, as Colab has none)"
        )
    if _uses_torch(path) and importlib.util.find_spec("torch") is None:
        pytest.skip(
            f"{path.name} runs Keras on torch, and PyTorch is not installed in this "
            f"environment (make test installs it in .venv; the Colab-pinned one has none)"
        )
    out_dir = test_output / "notebooks"
    nb, error = _execute(path, out_dir, variant)
    if error is not None:
        index, source = _failed_cell(nb)
        message = re.sub(r"\x1b\[[0-9;]*m", "", str(error))  # no terminal colours
        if len(message) > 4000:
            message = message[:1500] + "\n...\n" + message[-2500:]
        pytest.fail(
            f"{path.name}: cell {index} failed\n--- cell source ---\n{source}\n"
            f"--- error ---\n{message}\n(executed copy: {out_dir / _out_name(path, variant)})",
            pytrace=False,
        )
    ran = [c for c in nb.cells if c.cell_type == "code"]
    assert ran and all(c.execution_count is not None for c in ran), "some cells did not run"
    # cells tagged raises-exception show an error on purpose (a failing rank, a bad option);
    # they must really raise, and no other cell may
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        raised = any(o.get("output_type") == "error" for o in cell.outputs)
        expected = "raises-exception" in cell.metadata.get("tags", [])
        assert raised == expected, (
            f"{path.name}: cell {i} "
            + ("was expected to raise and did not" if expected else "raised")
            + f":\n{cell.source}"
        )


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_quickstart_as_a_newcomer_runs_it_shows_no_start_up_noise_and_no_waiting_dashboard(test_output):
    """01-quickstart in a fresh kernel in an empty folder with the environment a newcomer has
    (no TF_CPP_MIN_LOG_LEVEL, no warning filters: the suite's other kernels get those): no
    TensorFlow C++ start-up line in any cell's output, and every dashboard saved in the
    notebook finished (its state done, its progress read, never "waiting for fit()")."""
    from kdist_magics.watch.tf_logs import START_UP_NOISE

    path = ROOT / "notebooks" / "01-quickstart.ipynb"
    nb, error = _execute(path, test_output / "notebooks-newcomer", newcomer=True)
    assert error is None, str(error)[-3000:]
    texts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            texts.append(out.get("text", ""))
            texts += [v for k, v in out.get("data", {}).items() if k.startswith("text/") and isinstance(v, str)]
    noise = [
        line
        for text in texts
        for line in text.splitlines()
        if START_UP_NOISE.search(line) or re.match(r"[IWE]0000 00:00:", line)
    ]
    assert noise == [], noise
    # each finished dashboard is its output's final state (no widget left to show it)
    outputs = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]
    assert not [o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    dashboards = [
        json.loads(m.group(1))["state"]
        for o in outputs
        for m in re.finditer(
            r'<script type="application/json" class="kdist-data">'
            r"(.*?)</script>",
            o.get("data", {}).get("text/html", ""),
            re.S,
        )
    ]
    assert dashboards, "no dashboard was saved in the notebook"
    for st in dashboards:
        progress = st["progress"]
        assert st["status"] == "done" and not st["running"], st["status"]
        assert progress.get("total_steps") or progress.get("samples_per_s") or st.get("idle_note"), progress


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.anystack  # make demo runs in .venv, whichever environment runs the suite
@pytest.mark.timeout(600)
def test_make_demo_runs_the_quickstart(tmp_path):
    """``make demo``'s script: executes 01-quickstart, prints the copy's path and a summary."""
    import subprocess

    env = _kernel_env(tmp_path / "home", {})
    env["KDIST_DEMO_OUTPUT"] = str(tmp_path / "demo-output")
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "demo.py")],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    executed = tmp_path / "demo-output" / "01-quickstart.ipynb"
    assert f"executed notebook: {executed}" in done.stdout
    summary = [ln for ln in done.stdout.splitlines() if ln.startswith("kdist demo: ok in")]
    assert summary and "done in" in summary[0] and "test accuracy" in summary[0], done.stdout
    import nbformat

    nb = nbformat.read(executed, as_version=4)
    assert all(c.execution_count is not None for c in nb.cells if c.cell_type == "code")


def test_demo_summary_reads_the_outputs():
    import importlib.util

    spec = importlib.util.spec_from_file_location("kdist_demo", ROOT / "scripts" / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    cells = [
        new_code_cell("x", outputs=[new_output("stream", name="stdout", text=text)])
        for text in (
            "kdist: --strategy auto chose default: 2 cores, no GPU\n",
            "default: done in 5.5 s, 1/1 ranks done, last loss 0.186\n",
            "test accuracy: 93.6%\n",
        )
    ]
    line = demo.summarise(new_notebook(cells=cells))
    assert line == "default: done in 5.5 s, 1/1 ranks done, last loss 0.186; test accuracy 93.6%"
    assert demo.summarise(new_notebook(cells=[])) == "ran without a run summary in its output"
