#!/usr/bin/env bash
# One-command set-up of a virtual environment with kdist_magics. Idempotent: a second run with
# unchanged pyproject.toml and pins only checks and returns.
#
#   scripts/setup.sh [--browser]     .venv: the current stack (TensorFlow 2.21, Keras, JAX, JupyterLab,
#                                    test tools) on the newest Python 3.11+ found, 3.13 first, and
#                                    Horovod 0.28.1 built with Gloo against that TensorFlow (cached)
#   scripts/setup.sh --torch         also PyTorch (Keras on torch across engines); pip's default torch is
#                                    the CUDA build, ~5 GB, so only make test (and `make lab TORCH=1`) ask
#   scripts/setup.sh --ray           also Ray (--launcher ray; a 79 MB wheel): make test asks
#   scripts/setup.sh --env colab     .venv-colab: Colab's published stack (envs/colab-2026-08.txt as pip
#                                    constraints: Python 3.13, TF 2.20, IPython 7.34, ipywidgets 7.7,
#                                    ipyparallel 8.8, Notebook 6.5), no Horovod
#   scripts/setup.sh --env colab-tpu .venv-colab-tpu: Colab's TPU runtime (envs/colab-tpu-2026-08.txt:
#                                    Python 3.13, JAX 0.7.2, Keras 3.13.2, IPython 7.34), no TensorFlow
#
# --browser also makes sure Debian's chromium is present (the widget tests drive it), and as root
# iproute2 and Debian's slurm-wlm and munge (the netns and Slurm tests). Set
# KDIST_REQUIRE_HOROVOD=1 (make test does) to fail when Horovod cannot be built; otherwise
# set-up goes on without it and `--strategy horovod` says what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

want_browser=0
want_torch=0
want_ray=0
env_name=main
while [ $# -gt 0 ]; do
  case "$1" in
    --browser) want_browser=1 ;;
    --torch) want_torch=1 ;;
    --ray) want_ray=1 ;;
    --env) env_name=$2; shift ;;
    *) echo "usage: scripts/setup.sh [--browser] [--torch] [--ray] [--env main|colab|colab-tpu]" >&2; exit 2 ;;
  esac
  shift
done

say() { printf 'kdist setup: %s\n' "$*"; }
die() { printf 'kdist setup: ERROR: %s\n' "$*" >&2; exit 1; }

apt_install() {  # install Debian packages when we may, otherwise say exactly what is missing
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing system packages: $*"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/tmp/kdist-apt.log 2>&1; then
      apt-get update -q >/tmp/kdist-apt-update.log 2>&1 || true
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/tmp/kdist-apt.log 2>&1 \
        || die "apt-get install $* failed (see /tmp/kdist-apt.log)"
    fi
  else
    die "missing system packages: $*. Install them (e.g. sudo apt-get install $*) and run again."
  fi
}

# A working interpreter of version $1 (3.13, ...): on PATH, or under pyenv's versions folder.
find_python() {
  local v=$1 c
  for c in "python$v" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/python"$v"; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys, venv' >/dev/null 2>&1; then
      command -v "$c"; return 0
    fi
  done
  return 1
}

# Installing into a venv: by way of uv where it can be had (the same packages as pip resolves
# here, from its cache in about half pip's time, bytecode compiled included: measured 2.5 min
# against ~5 min for .venv on 2 busy cores), else pip. pip's own configured constraint file, if
# any, is passed on, so both install the same versions. KDIST_INSTALLER=pip: pip only.
venv_install() {  # venv_install PYTHON PIP-INSTALL-ARGS...
  local py=$1 uv c
  shift
  uv="$(dirname "$py")/uv"
  if [ "${KDIST_INSTALLER:-uv}" = uv ] && { [ -x "$uv" ] || "$py" -m pip install -q uv >/dev/null 2>&1; }; then
    local extra=()
    c=$("$py" -m pip config get global.constraint 2>/dev/null || true)
    [ -n "$c" ] && [ -f "$c" ] && extra+=(--constraint "$c")
    # compiled now, as pip does: where PYTHONDONTWRITEBYTECODE is set (CI images, containers)
    # every process would otherwise compile TensorFlow anew (measured: 33 s an import, not 16)
    "$uv" pip install -q --compile-bytecode --python "$py" "${extra[@]}" "$@" && return 0
    say "uv could not install that; trying pip"
  fi
  "$py" -m pip install -q "$@"
}

make_venv() {  # make_venv DIR PYTHON: a venv at DIR on PYTHON (kept when it already is one)
  local dir=$1 py=$2
  if [ -x "$dir/bin/python" ]; then
    local have want
    have=$("$dir/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    want=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    [ "$have" = "$want" ] && return 0
    say "$dir has Python $have; making it anew on $want"
    rm -rf "$dir"
  fi
  say "creating $dir ($("$py" -V 2>&1))"
  "$py" -m venv "$dir"
}

# pinned_venv DEFAULT-VENV PINS WHAT PACKAGE-ARGS...: a Python 3.13 venv (Colab's) with PACKAGE-ARGS
# installed under the pins file PINS as pip constraints, again only when pyproject.toml, PINS or
# PACKAGE-ARGS change
pinned_venv() {
  local pins=$2 what=$3 stamp want
  VENV=${VENV:-$1}
  shift 3
  PYTHON=${PYTHON:-$(find_python 3.13 || true)}
  [ -n "$PYTHON" ] || die "the $what environment needs Python 3.13 (none on PATH or under pyenv); set PYTHON=/path/to/python3.13"
  make_venv "$VENV" "$PYTHON"
  PY="$VENV/bin/python"
  stamp="$VENV/.kdist-installed"
  want="$({ cat pyproject.toml "$pins"; echo "$*"; } | sha256sum | cut -c1-16) $env_name"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    say "installing kdist_magics into $VENV under $what's pins ($pins)"
    venv_install "$PY" -c "$pins" "$@"
    echo "$want" > "$stamp"
  else
    say "$VENV is up to date"
  fi
}

if [ "$env_name" = colab ]; then
  # Colab's runtime is Python 3.13 (envs/colab-2026-08.txt); nothing else stands in for it.
  # pip itself stays as venv made it: Colab's pip (24.1.2) is older than Python 3.13's ensurepip
  pinned_venv .venv-colab envs/colab-2026-08.txt Colab -e ".[tensorflow,jax]" \
    ipykernel notebook nbclient nbformat pandas scikit-learn matplotlib tensorboard pytest \
    pytest-timeout hypothesis playwright
  say "ready: $VENV ($("$PY" -c 'import sys, tensorflow as tf, keras, IPython, ipywidgets, ipyparallel; print(f"Python {sys.version.split()[0]}, TF {tf.__version__}, Keras {keras.__version__}, IPython {IPython.__version__}, ipywidgets {ipywidgets.__version__}, ipyparallel {ipyparallel.__version__}")' 2>/dev/null))"
  exit 0
fi

if [ "$env_name" = colab-tpu ]; then
  # Colab's TPU runtime: Python 3.13, JAX 0.7.2, Keras 3.13.2, PyTorch 2.9 and no TensorFlow
  # (envs/colab-tpu-2026-08.txt); JAX's CPU jaxlib of that version stands in for the TPU build.
  # Colab installs torch 2.9.0's CPU build from download.pytorch.org (not in the pins: a URL);
  # PyPI's build of the same version runs on the CPU alike. It is also the torch-only stack
  # (tests/test_without_tensorflow.py hides JAX for that).
  pinned_venv .venv-colab-tpu envs/colab-tpu-2026-08.txt "Colab's TPU runtime" -e ".[jax]" keras \
    torch==2.9.0 ipykernel nbclient nbformat pandas scikit-learn matplotlib pytest pytest-timeout hypothesis
  "$PY" -c 'import tensorflow' >/dev/null 2>&1 && die "$VENV has TensorFlow; Colab's TPU runtime has none"
  say "ready: $VENV ($(KERAS_BACKEND=jax "$PY" -c 'import sys, jax, keras, torch, IPython, ipyparallel; print(f"Python {sys.version.split()[0]}, JAX {jax.__version__}, Keras {keras.__version__}, PyTorch {torch.__version__}, IPython {IPython.__version__}, ipyparallel {ipyparallel.__version__}, no TensorFlow")' 2>/dev/null))"
  exit 0
fi

[ "$env_name" = main ] || die "unknown environment '$env_name' (main, colab or colab-tpu)"
VENV=${VENV:-.venv}

# 1. Python: $PYTHON, else the newest of 3.13, 3.12, 3.11 found
if [ -z "${PYTHON:-}" ]; then
  for v in 3.13 3.12 3.11; do PYTHON=$(find_python $v || true); [ -n "$PYTHON" ] && break; done
fi
[ -n "${PYTHON:-}" ] || PYTHON=python3
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || die "Python 3.11 or newer is needed ($PYTHON is $("$PYTHON" -V 2>&1)); set PYTHON=/path/to/python3.13"

# 2. Build tools for Horovod
missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v g++ >/dev/null || missing+=(g++)
command -v patch >/dev/null || missing+=(patch)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then apt_install "${missing[@]}"
  else say "not found: ${missing[*]} (needed to build Horovod; install them for --strategy horovod)"; fi
fi

# 3. The virtual environment and the package with its extras
make_venv "$VENV" "$PYTHON"
PY="$VENV/bin/python"
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then tf_extra=tensorflow; else tf_extra=tensorflow-cpu; fi
extras="$tf_extra,jax,lab,test,docs"
[ $want_torch = 1 ] && extras="$extras,torch"
[ $want_ray = 1 ] && extras="$extras,ray"
stamp="$VENV/.kdist-installed"
hash="$(sha256sum pyproject.toml | cut -c1-16)"
have_hash="" have_extras=""
[ -f "$stamp" ] && read -r have_hash have_extras < "$stamp" || true
[ "${have_hash:-}" = "$hash" ] || have_extras=""  # same pyproject: keep what is installed (torch after make test)
extras=$(printf '%s\n' ${have_extras//,/ } ${extras//,/ } | sort -u | paste -sd, -)
if [ "${have_hash:-}" != "$hash" ] || [ "${have_extras:-}" != "$extras" ]; then
  say "installing kdist_magics[$extras] into $VENV"
  "$PY" -m pip install -q --upgrade pip wheel setuptools
  venv_install "$PY" -e ".[$extras]"
  echo "$hash $extras" > "$stamp"
else
  say "$VENV is up to date"
fi

# 3b. keras-hub 0.32 for the sharded tests (a backbone's own layout map), without its
#     tensorflow-text dependency: that one needs the full `tensorflow` package beside
#     tensorflow-cpu (the same files twice, 600 MB more). Its models import without it.
if ! "$PY" -c 'import keras_hub' >/dev/null 2>&1; then
  say "installing keras-hub 0.32 (without tensorflow-text) into $VENV"
  venv_install "$PY" --no-deps "keras-hub==0.32.*" \
    && venv_install "$PY" regex rich "kagglehub!=1.0.1" "kagglesdk==0.1.28" sentencepiece tokenizers \
    || say "keras-hub did not install: the test of a backbone's own layout map is skipped"
fi

# 4. Horovod 0.28.1 with Gloo, built against the TensorFlow just installed (patched: see
#    kdist_magics/strategies/horovod/patches/); the wheel is cached under ~/.cache/kdist_magics, so a fresh .venv
#    reuses it in seconds.
if ! "$PY" -c 'import horovod.tensorflow' >/dev/null 2>&1; then
  if ! "$PY" -m kdist_magics.strategies.horovod.build; then
    [ "${KDIST_REQUIRE_HOROVOD:-0}" = 1 ] && die "Horovod is required here (KDIST_REQUIRE_HOROVOD=1) but could not be built"
    say "going on without Horovod: every strategy but horovod works"
  fi
fi

# 5. A browser for the widget tests (Debian's chromium; Playwright drives it)
if [ $want_browser = 1 ] && [ ! -x /usr/bin/chromium ]; then
  apt_install chromium
fi

# 6. The network-namespace tests (root only, e.g. CI): iproute2's `ip`, util-linux's `unshare`
if [ $want_browser = 1 ] && [ "$(id -u)" = 0 ]; then
  missing=()
  command -v ip >/dev/null || missing+=(iproute2)
  command -v unshare >/dev/null || missing+=(util-linux)
  [ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"
fi

# 7. The Slurm tests (root only, e.g. CI): Debian's slurmctld/slurmd and munge, started by the
#    tests themselves (tests/slurm_cluster.py) in a temporary folder; nothing runs after set-up
if [ $want_browser = 1 ] && [ "$(id -u)" = 0 ]; then
  missing=()
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null || missing+=(slurm-wlm)
  command -v munged >/dev/null || missing+=(munge)
  [ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"
fi
say "ready: $VENV ($("$PY" -c '
import sys, tensorflow as tf, keras
try:
    import horovod; hvd = f"Horovod {horovod.__version__}"
except ImportError:
    hvd = "no Horovod"
print(f"Python {sys.version.split()[0]}, TF {tf.__version__}, Keras {keras.__version__}, {hvd}")' 2>/dev/null))"
