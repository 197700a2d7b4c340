#!/usr/bin/env bash
# One-command set-up: .venv with kdist_magics, TensorFlow, Horovod (Gloo) and the test tools.
# Idempotent: a second run with an unchanged pyproject.toml only checks and returns.
# Usage: scripts/setup.sh [--browser]   (--browser also makes sure Debian's chromium is present)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
want_browser=0
[ "${1:-}" = "--browser" ] && want_browser=1

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

# 1. Python 3.11+
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || die "Python 3.11 or newer is needed ($PYTHON is $("$PYTHON" -V 2>&1)); set PYTHON=/path/to/python3.11"

# 2. Build tools for Horovod
missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v g++ >/dev/null || missing+=(g++)
[ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"

# 3. The virtual environment and the package with its extras
[ -x "$VENV/bin/python" ] || { say "creating $VENV"; "$PYTHON" -m venv "$VENV"; }
PY="$VENV/bin/python"
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then tf_extra=tensorflow; else tf_extra=tensorflow-cpu; fi
extras="$tf_extra,jax,lab,test"
stamp="$VENV/.kdist-installed"
want="$(sha256sum pyproject.toml | cut -c1-16) $extras"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "installing kdist_magics[$extras] into $VENV"
  "$PY" -m pip install -q --upgrade pip wheel setuptools
  "$PY" -m pip install -q -e ".[$extras]"
  echo "$want" > "$stamp"
else
  say "$VENV is up to date"
fi

# 4. Horovod 0.28.1 with Gloo, compiled against the TensorFlow just installed.
#    pip keeps the built wheel in its cache, so a fresh .venv reuses it in seconds.
if ! "$PY" -c 'import horovod.tensorflow' >/dev/null 2>&1; then
  say "building Horovod 0.28.1 with Gloo against TensorFlow (first time: a few minutes)"
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
  HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
    "$PY" -m pip install -q --no-build-isolation "horovod==0.28.1" \
    || die "Horovod failed to build; see pip's output above (needs cmake, g++, TensorFlow <= 2.18.1)"
  "$PY" -c 'import horovod.tensorflow' || die "Horovod installed but does not import"
fi

# 5. A browser for the JupyterLab widget tests (Debian's chromium; Playwright drives it)
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
say "ready: $VENV ($("$PY" -c 'import tensorflow as tf, keras, horovod; print(f"TF {tf.__version__}, Keras {keras.__version__}, Horovod {horovod.__version__}")' 2>/dev/null))"
