"""Build netreduce: the pure-Python core, the framework adapters and the native
extension ``netreduce._native`` (C++17, pybind11, -O3, no -march=native: the SIMD
reduction kernels pick their instruction set at run time)."""
import glob
import os

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))


def native_sources():
    found = glob.glob(os.path.join("native", "**", "*.cc"), recursive=True)
    return sorted(found)


ext = Pybind11Extension(
    "netreduce._native",
    native_sources(),
    include_dirs=["native"],
    cxx_std=17,
    extra_compile_args=["-O3", "-fvisibility=hidden", "-Wall", "-Wno-unused-function", "-fwrapv"],
    libraries=["z"],
)

setup(
    name="netreduce",
    version="0.1.0",
    description="In-network aggregation all-reduce for distributed deep-learning training",
    python_requires=">=3.9",
    packages=["netreduce", "netreduce.control", "netreduce.testbed", "netreduce.torch"],
    package_dir={"netreduce.torch": "frameworks/torch"},
    ext_modules=[ext],
    cmdclass={"build_ext": build_ext},
    install_requires=["numpy>=1.21"],
    extras_require={
        "test": ["pytest>=7", "hypothesis>=6", "pytest-timeout"],
        "torch": ["torch"],
        "bench": ["matplotlib", "mpi4py"],
    },
    entry_points={
        "console_scripts": [
            "netreduce-switch=netreduce.switch:main",
            "netreduce-run=netreduce.launcher:main",
            "netreduce-testbed=netreduce.testbed.cli:main",
            "netreduce=netreduce.cli:main",
        ]
    },
    zip_safe=False,
)
