"""The wheel ships what users import: every adapter, its subpackages, the files it
reads at run time and the console scripts (tests/installed.py builds and installs it;
the TensorFlow and PyTorch launch tests run their ranks from it too)."""
import importlib.util
import os

import pytest

from tests.installed import where


def test_wheel_ships_every_adapter_and_its_files(installed):
    site = installed.site
    for rel in ("netreduce/__init__.py", "netreduce/_native.pyi", "netreduce/algorithms/flat.py",
                "netreduce/torch/__init__.py", "netreduce/mxnet/__init__.py",
                "netreduce/tensorflow/__init__.py", "netreduce/tensorflow/keras/__init__.py",
                "netreduce/tensorflow/keras/callbacks.py",
                "netreduce/tensorflow/kernels/collective_ops.cc"):
        assert os.path.isfile(os.path.join(site, rel)), rel
    assert [f for f in os.listdir(os.path.join(site, "netreduce")) if f.startswith("_native")
            and f.endswith(".so")]
    for script in ("netreduce-run", "netreduce-switch", "netreduce", "netreduce-testbed"):
        assert os.access(os.path.join(installed.bin_dir, script), os.X_OK), script


def test_installed_package_is_the_one_imported(installed):
    """Run from outside the checkout, netreduce comes from the wheel, not the source
    tree or the editable install."""
    assert where(installed, "netreduce").startswith(installed.site)
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("tensorflow is not importable")
    assert where(installed, "netreduce.tensorflow.keras").startswith(installed.site)
