"""benchmarks/common.py's machine description, written into every benchmark's record:
the installed versions without importing the frameworks (a driver such as
benchmarks/train.py never uses torch itself; importing it only for ``__version__``
cost ~2.8 CPU-s of every run, the test suite's included)."""
import importlib.metadata
import os
import subprocess
import sys

from tests.procs import last_json

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROBE = """
import json, sys
sys.path.insert(0, "benchmarks")
import common
d = common.machine_description()
print(json.dumps({"machine": d, "imported": sorted(m for m in ("numpy", "torch", "horovod")
                                                  if m in sys.modules)}))
"""


def test_versions_come_from_the_metadata_without_importing_the_frameworks():
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = last_json(proc.stdout)
    assert out["imported"] == [], out
    for name in ("numpy", "torch", "horovod"):
        try:
            want = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            want = None
        assert out["machine"][name] == want, (name, out["machine"])


def test_a_module_already_imported_or_without_metadata_is_asked_itself(monkeypatch, tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import common
    finally:
        sys.path.pop(0)
    (tmp_path / "nr_no_metadata_mod.py").write_text("__version__ = '9.9'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert common._version("nr_no_metadata_mod") == "9.9"
    assert common._version("nr_no_such_module_anywhere") is None
    if "numpy" in sys.modules:
        assert common._version("numpy") == sys.modules["numpy"].__version__
