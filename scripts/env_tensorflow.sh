#!/usr/bin/env bash
# TensorFlow for netreduce.tensorflow's tests, example and benchmark.
# tensorflow-cpu 2.21 shares the main environment: its pins (numpy>=1.26,
# protobuf>=6.31, h5py<3.15, ml_dtypes<1, keras>=3.12) change nothing that torch 2.13
# or the rest of the test setup installed, so no separate venv is needed (MXNet, which
# needs numpy<1.24, is the one that gets its own). Idempotent: a no-op when importable.
set -euo pipefail
py=${PYTHON:-python3}
if $py -c "import tensorflow, keras" >/dev/null 2>&1; then
  exit 0
fi
echo "env_tensorflow.sh: pip install tensorflow-cpu 2.21 into $($py -c 'import sys; print(sys.prefix)')"
$py -m pip install -q "tensorflow-cpu==2.21.*"
# Imports, checked: TensorFlow's C++ start-up log (oneDNN, CPU features) is shown only
# when the import fails.
if ! out=$($py -c "import tensorflow, keras" 2>&1); then
  echo "$out" >&2
  exit 1
fi
