"""Build Horovod 0.28.1 with Gloo against the TensorFlow installed here, and cache the wheel.

Horovod's last release (0.28.1, June 2023) does not build against TensorFlow >= 2.19 as
published: its CMake list compiles an opt-in XLA op whose headers TF no longer ships. This
fetches the sdist, applies the patch in ``kdist_magics/strategies/horovod/patches/`` (each hunk says why), builds
a wheel with Gloo (no MPI, no PyTorch, no MXNet) and installs it. The wheel is kept in a cache
folder keyed by Horovod's, TensorFlow's and Python's versions and the patch's hash, so a fresh
virtual environment on the same machine installs it in seconds::

    python -m kdist_magics.strategies.horovod.build            # build (or reuse) and install
    python -m kdist_magics.strategies.horovod.build --check    # say what it would do; build nothing

Needs ``cmake`` and a C++17 compiler. GPU (NCCL) builds are not attempted here: against
TF >= 2.19 they need further patches (conda-forge's horovod-feedstock carries them), so on a
GPU machine this builds the Gloo (CPU collectives) variant and says so.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "0.28.1"
PATCH = Path(__file__).with_name("patches") / "horovod-0.28.1-tensorflow-2.19.patch"
BUILD_ENV = {
    "HOROVOD_WITH_TENSORFLOW": "1",
    "HOROVOD_WITH_GLOO": "1",
    "HOROVOD_WITHOUT_MPI": "1",
    "HOROVOD_WITHOUT_PYTORCH": "1",
    "HOROVOD_WITHOUT_MXNET": "1",
}


class BuildError(RuntimeError):
    """Horovod cannot be built here; the message names what is missing."""


def say(message: str) -> None:
    print(f"kdist horovod: {message}", flush=True)


def tensorflow_version(python: str) -> tuple[str, str]:
    """(TensorFlow's version, the interpreter's tag such as 'cp313') of ``python``."""
    code = "import sys, tensorflow as tf; print(tf.__version__, 'cp%d%d' % sys.version_info[:2])"
    out = subprocess.run(
        [python, "-c", code], capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    )
    if out.returncode != 0:
        raise BuildError(
            "TensorFlow is not importable here; install it first (pip install 'kdist_magics[tensorflow-cpu]')"
        )
    version, tag = out.stdout.strip().splitlines()[-1].split()
    return version, tag


def missing_tools() -> list[str]:
    need = {"cmake": "cmake", "c++": "g++", "patch": "patch"}
    return [pkg for tool, pkg in need.items() if shutil.which(tool) is None]


def cache_dir(tf_version: str, tag: str, root: Path | None = None) -> Path:
    """Where the wheel for this Horovod/TensorFlow/Python/patch combination is kept."""
    root = root or Path(os.environ.get("KDIST_CACHE", Path.home() / ".cache" / "kdist_magics"))
    patch_hash = hashlib.sha256(PATCH.read_bytes()).hexdigest()[:10]
    return root / "horovod" / f"{VERSION}-tf{tf_version}-{tag}-{patch_hash}"


def cached_wheel(folder: Path) -> Path | None:
    wheels = sorted(folder.glob(f"horovod-{VERSION}-*.whl"))
    return wheels[-1] if wheels else None


def pip(python: str, *args: str, env: dict | None = None) -> None:
    subprocess.run([python, "-m", "pip", *args], check=True, env=env)


def build(python: str, folder: Path) -> Path:
    """Fetch the sdist, patch it, build the wheel into ``folder``; returns the wheel."""
    missing = missing_tools()
    if missing:
        raise BuildError(f"building Horovod needs {', '.join(missing)} (e.g. sudo apt-get install {' '.join(missing)})")
    with tempfile.TemporaryDirectory(prefix="kdist-horovod-") as tmp:
        tmp = Path(tmp)
        pip(python, "download", "-q", "--no-deps", "--no-binary", ":all:", f"horovod=={VERSION}", "-d", str(tmp))
        sdist = next(tmp.glob(f"horovod-{VERSION}.tar.gz"))
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(tmp)
        src = tmp / f"horovod-{VERSION}"
        subprocess.run(
            ["patch", "-p1", "--forward", "--input", str(PATCH)], cwd=src, check=True, stdout=subprocess.DEVNULL
        )
        if gpu_present():
            say(
                "an NVIDIA GPU is present: building the Gloo variant (CPU collectives). A NCCL build "
                "against TensorFlow >= 2.19 needs further patches (conda-forge's horovod-feedstock: "
                "StatusOr, GPU stream) that kdist does not carry"
            )
        env = {**os.environ, **BUILD_ENV}
        env.pop("HOROVOD_GPU_OPERATIONS", None)
        env.setdefault("MAKEFLAGS", f"-j{os.cpu_count() or 1}")
        folder.mkdir(parents=True, exist_ok=True)
        pip(python, "wheel", "-q", "--no-build-isolation", "--no-deps", str(src), "-w", str(tmp / "out"), env=env)
        wheel = next((tmp / "out").glob(f"horovod-{VERSION}-*.whl"))
        target = folder / wheel.name
        shutil.move(str(wheel), target.with_suffix(".part"))
        os.replace(target.with_suffix(".part"), target)  # a half-written wheel is never "cached"
        return target


def gpu_present() -> bool:
    return (
        shutil.which("nvidia-smi") is not None
        and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0
    )


def ensure(python: str = sys.executable, check: bool = False) -> str:
    """Install Horovod into ``python``'s environment (cached wheel, else build); a one-line outcome."""
    tf, tag = tensorflow_version(python)
    folder = cache_dir(tf, tag)
    wheel = cached_wheel(folder)
    if check:
        return f"would install {wheel}" if wheel else f"would build Horovod {VERSION} against TF {tf} into {folder}"
    if wheel is None:
        say(f"building Horovod {VERSION} with Gloo against TensorFlow {tf} (first time: a few minutes)")
        wheel = build(python, folder)
    pip(python, "install", "-q", "--no-deps", "--force-reinstall", str(wheel))
    probe = subprocess.run([python, "-c", "import horovod.tensorflow"], capture_output=True, text=True)
    if probe.returncode != 0:
        raise BuildError(
            f"Horovod installed from {wheel} but does not import: {probe.stderr.strip().splitlines()[-1:]}"
        )
    return f"Horovod {VERSION} for TensorFlow {tf} installed from {wheel}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kdist_magics.strategies.horovod.build", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--python", default=sys.executable, help="the environment's interpreter (default: this one)")
    parser.add_argument("--check", action="store_true", help="say what would happen; build nothing")
    args = parser.parse_args(argv)
    try:
        say(ensure(args.python, check=args.check))
    except BuildError as exc:
        say(f"cannot build Horovod: {exc}")
        return 2
    except subprocess.CalledProcessError as exc:
        say(
            f"cannot build Horovod: {' '.join(map(str, exc.cmd[:4]))} ... failed (exit {exc.returncode}); "
            "see the output above"
        )
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
