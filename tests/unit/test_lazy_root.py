"""The package root loads its public names on first use (netreduce/__init__.py), so
the layer rule holds at run time too: the daemon, imported in a fresh interpreter,
loads no worker, algorithm or API module (the import-linter contracts check the
same statically: pyproject.toml, scripts/check_imports.py)."""
from __future__ import annotations

import ast
import json
import pathlib
import subprocess
import sys
from typing import List

import netreduce

ROOT = pathlib.Path(__file__).resolve().parents[2]
# What the daemon must not load: the worker's side and what sits above it.
FORBIDDEN = ("netreduce.worker", "netreduce.algorithms", "netreduce.api",
             "netreduce.alltoall", "netreduce.elastic", "netreduce.launcher",
             "netreduce.torch", "netreduce.tensorflow", "netreduce.mxnet")


def loaded_after(code: str, prefix: str = "netreduce") -> List[str]:
    """The modules under ``prefix`` a fresh interpreter holds after running ``code``."""
    probe = (f"{code}\nimport json, sys\n"
             f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({prefix!r}))))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60, cwd=ROOT, check=True).stdout
    return json.loads(out.splitlines()[-1])


def forbidden(modules: List[str]) -> List[str]:
    return [m for m in modules if m.startswith(FORBIDDEN)]


def test_the_daemon_loads_no_worker_code():
    modules = loaded_after("import netreduce.switch.daemon")
    assert "netreduce.switch.daemon" in modules
    assert forbidden(modules) == []


def test_the_daemon_starts_without_numpy():
    # The daemon holds no array: numpy's import was ~0.1 s of each of the suite's
    # hundreds of daemon starts (netreduce/dtypes.py). Its --help and its command set
    # (the coordinator's too) load here.
    assert loaded_after("import netreduce.switch.daemon\n"
                        "netreduce.switch.daemon.build_parser()", prefix="numpy") == []
    assert loaded_after("import netreduce.ops", prefix="numpy") != []  # the probe sees it


def test_the_check_sees_a_worker_module_when_one_loads():
    # The probe can fail: using a public name loads the API, and it says so.
    modules = loaded_after("import netreduce.switch.daemon, netreduce\nnetreduce.init")
    assert "netreduce.api" in forbidden(modules)


def test_public_names_resolve_as_before():
    from netreduce import Handle, ReduceOp, allreduce, alltoall  # noqa: F401
    import netreduce.alltoall as _module  # noqa: F401  a sub-module shadowed by its function
    assert callable(netreduce.init) and callable(netreduce.alltoall)
    assert netreduce.alltoall.__module__ == "netreduce.alltoall"
    assert netreduce.Sum is ReduceOp.Sum
    for name in netreduce.__all__:
        assert getattr(netreduce, name) is not None, name
        assert name in dir(netreduce), name
    assert netreduce.api.init is netreduce.init  # a bare `import netreduce` gave .api
    try:
        netreduce.no_such_name  # noqa: B018  the lookup is the test
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("an unknown attribute resolved")


def test_type_checkers_see_the_same_names():
    # The TYPE_CHECKING imports repeat _PUBLIC for type checkers: same names, same modules.
    tree = ast.parse((ROOT / "netreduce" / "__init__.py").read_text())
    block = next(n for n in ast.walk(tree)
                 if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test))
    imported = {alias.name: node.module for node in block.body
                if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert imported == netreduce._PUBLIC
