#!/usr/bin/env bash
# Builds (once) and installs Horovod 0.28.1 for tfdist's `--strategy horovod` path.
#
# Horovod 0.28.1 (PyPI's newest, 2023-06) compiles only against older TensorFlow:
# 2.18.1 works; 2.19.1 and 2.21.0 fail on XLA headers TF no longer ships (the
# upstream fix, horovod PR #4302, was never released). So this path lives in its
# own virtualenv with tensorflow-cpu 2.18.1, while the rest of tfdist runs on the
# newest TensorFlow.
#
# The built wheel is cached (TFDIST_WHEEL_CACHE), so a re-install takes seconds
# instead of the 4-5 minute compile.
#
# Usage: scripts/install_horovod.sh            # venv at $TFDIST_HOROVOD_VENV
#   TFDIST_HOROVOD_VENV   venv path (default ~/.cache/tfdist/horovod-venv)
#   TFDIST_WHEEL_CACHE    wheel cache (default ~/.cache/tfdist/wheels)
#   PYTHON                interpreter for the venv (default python3)
set -euo pipefail

HOROVOD_VERSION=0.28.1
TF_VERSION=2.18.1
KERAS_VERSION=3.15.1
VENV=${TFDIST_HOROVOD_VENV:-$HOME/.cache/tfdist/horovod-venv}
WHEELS=${TFDIST_WHEEL_CACHE:-$HOME/.cache/tfdist/wheels}
PY=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1

# MPI from Debian (mpirun and headers); Gloo is vendored in horovod's sources.
if ! command -v mpirun >/dev/null || ! command -v mpicc >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev
  else
    echo "install_horovod.sh: OpenMPI is missing. HINT: apt-get install openmpi-bin libopenmpi-dev" >&2
    exit 1
  fi
fi

if ! [ -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip"

# Fast path: the venv already holds exactly these versions.
if "$VENV/bin/python" - "$HOROVOD_VERSION" "$TF_VERSION" "$KERAS_VERSION" <<'PYEOF' 2>/dev/null
import sys
from importlib.metadata import version
want = dict(zip(("horovod", "tensorflow-cpu", "keras"), sys.argv[1:]))
sys.exit(any(version(name) != v for name, v in want.items()))
PYEOF
then
  "$VENV/bin/horovodrun" --check-build
  echo "install_horovod.sh: ready (cached): $VENV"
  exit 0
fi
$PIP install -q "tensorflow-cpu==$TF_VERSION" "keras==$KERAS_VERSION" \
  setuptools wheel cloudpickle psutil pyyaml packaging scikit-learn

wheel=$(ls "$WHEELS"/horovod-"$HOROVOD_VERSION"-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$wheel" ]; then
  mkdir -p "$WHEELS"
  echo "install_horovod.sh: compiling horovod $HOROVOD_VERSION (4-5 minutes on 2 cores)..." >&2
  # --no-build-isolation: horovod's setup.py must see the venv's TensorFlow.
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
  HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
  MAKEFLAGS=${MAKEFLAGS:--j2} \
    $PIP wheel -q --no-build-isolation --no-deps -w "$WHEELS" "horovod==$HOROVOD_VERSION"
  wheel=$(ls "$WHEELS"/horovod-"$HOROVOD_VERSION"-*.whl | head -n1)
fi
$PIP install -q --force-reinstall --no-deps "$wheel"
# tfdist itself is not installed here, so one cached venv serves every checkout:
# run with PYTHONPATH=<checkout> (tfdist's tests and README do).

"$VENV/bin/horovodrun" --check-build
echo "install_horovod.sh: ready: $VENV (horovodrun at $VENV/bin/horovodrun)"
