"""The layer rule (docs/design.md, "Map") holds and is really checked: the
import-linter contracts of pyproject.toml pass over the package as it installs
(scripts/check_imports.py stages it: the adapters at netreduce.<name>, the native
binding as a module), each contract fails when a copy of the tree breaks it, and no
import cycle is left in netreduce/, frameworks/ or benchmarks/ — nor escapes the
check by hiding in a function."""
from __future__ import annotations

import concurrent.futures
import importlib.util
import pathlib
import re
import shutil
import subprocess

import importlinter  # noqa: F401  (a test dependency: the contracts cannot run without it)
import pytest

try:
    import tomllib
except ImportError:  # Python < 3.11: import-linter's own TOML reader
    import tomli as tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_imports", ROOT / "scripts" / "check_imports.py")
check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check)

CONTRACTS = {
    "layers": "Layers:",
    "daemon": "The daemon imports no worker code",
    "worker": "The worker imports no daemon code",
    "adapters": "The adapters do not import each other",
    "frameworks": "The core never imports a framework",
    "acyclic": "No package's sub-packages",
}


@pytest.fixture(scope="module")
def staged(tmp_path_factory) -> pathlib.Path:
    return check.stage(tmp_path_factory.mktemp("installed"))


def _broken(out: subprocess.CompletedProcess) -> set:
    lines = out.stdout.splitlines()
    return {key for key, name in CONTRACTS.items()
            for i, line in enumerate(lines)
            if line.startswith(name) and "BROKEN" in " ".join(lines[i:i + 2])}


def test_the_package_as_it_installs_has_the_adapters_and_the_binding(staged):
    for module in ("torch/__init__.py", "tensorflow/keras/__init__.py", "mxnet/__init__.py",
                   "_native.py", "worker/communicator.py", "switch/server.py"):
        assert (staged / "netreduce" / module).is_file(), module


def test_every_contract_is_kept(staged):
    out = check.lint(staged)
    assert out.returncode == 0, out.stdout + out.stderr
    for name in CONTRACTS.values():
        assert any(line.startswith(name) and "KEPT" in line + nxt for line, nxt in
                   zip(out.stdout.splitlines(), out.stdout.splitlines()[1:] + [""])), \
            (name, out.stdout)


# One import that breaks the rule, added to a copy of the tree: (file, line, contracts
# that must then report it broken).
VIOLATIONS = {
    "the worker imports the daemon": (
        "worker/communicator.py", "from netreduce.switch import server", {"layers", "worker"}),
    "the daemon imports the worker": (
        "switch/server.py", "from netreduce.worker import dataplane", {"layers", "daemon"}),
    "the daemon imports an algorithm": (
        "switch/coordinator.py", "from netreduce.algorithms import flat", {"daemon"}),
    "an algorithm imports the daemon": (
        "algorithms/select.py", "from netreduce.switch import in_process", {"layers", "worker"}),
    "the protocol imports the worker": (
        "protocol/address.py", "import netreduce.worker.failover", {"layers"}),
    "the core imports the public API": (
        "ops.py", "from netreduce import api", {"layers"}),
    "the core imports torch": (
        "config.py", "import torch", {"frameworks"}),
    "an algorithm imports tensorflow, inside a function": (
        "algorithms/flat.py", "def _tf():\n    import tensorflow\n", {"frameworks"}),
    "the worker imports an adapter": (
        "worker/process_sets.py", "import netreduce.torch", {"layers", "frameworks"}),
    "an adapter imports another": (
        "torch/mpi_ops.py", "import netreduce.mxnet", {"layers", "adapters"}),
    "two modules of a package import each other": (
        "worker/timeline.py", "from netreduce.worker import handle", {"acyclic"}),
}


@pytest.fixture(scope="module")
def broken_copies(staged, tmp_path_factory) -> dict:
    """lint-imports over one copy of the tree per violation (a few at once)."""
    def one(what: str) -> subprocess.CompletedProcess:
        path, line, _ = VIOLATIONS[what]
        tree = tmp_path_factory.mktemp("broken")
        shutil.copytree(staged, tree, dirs_exist_ok=True)
        target = tree / "netreduce" / path
        target.write_text(target.read_text() + "\n" + line + "\n")
        return check.lint(tree)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return dict(zip(VIOLATIONS, pool.map(one, VIOLATIONS)))


@pytest.mark.parametrize("what", sorted(VIOLATIONS))
def test_each_rule_fails_when_broken(broken_copies, what):
    out = broken_copies[what]
    assert out.returncode != 0, out.stdout
    assert VIOLATIONS[what][2] <= _broken(out), (what, _broken(out), out.stdout)


def test_no_import_cycle():
    found = check.cycles(check.import_graph(check.source_modules()))
    assert found == [], found


def test_a_cycle_through_an_import_inside_a_function_is_found(tmp_path):
    """The cycle check reads function-level imports too, and a benchmark script's
    bare-name imports of its siblings."""
    (tmp_path / "setup.py").write_text("FRAMEWORKS = {'netreduce.fw': 'frameworks/fw'}\n")
    pkg = tmp_path / "netreduce"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from netreduce.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def late():\n    from . import a\n")
    (tmp_path / "frameworks" / "fw").mkdir(parents=True)
    (tmp_path / "frameworks" / "fw" / "__init__.py").write_text("from .x import y\n")
    (tmp_path / "frameworks" / "fw" / "x.py").write_text("def y():\n    import netreduce.fw\n")
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "one.py").write_text("import two\n")
    (tmp_path / "benchmarks" / "two.py").write_text("def f():\n    from one import g\n")
    found = check.cycles(check.import_graph(check.source_modules(tmp_path)))
    assert found == [["benchmarks.one", "benchmarks.two"], ["netreduce.sub.a", "netreduce.sub.b"]], \
        found


def _map_rooms() -> dict:
    """docs/design.md's map: room -> its layer (1 = top)."""
    rooms = {}
    for line in (ROOT / "docs" / "design.md").read_text().splitlines():
        match = re.match(r"\| (\d+) \| ([^|]+) \|", line)
        if not match:
            continue
        base = ""
        for token in re.findall(r"`([^`]+)`", match.group(2)):
            if token.startswith("netreduce."):
                name = token.split(".", 1)[1]
            else:
                if "/" in token.rstrip("/"):
                    base, token = token.rstrip("/").split("/", 1)
                name = token.rstrip("/")
                name = name[:-3] if name.endswith(".py") else name
            rooms[name] = int(match.group(1))
    return rooms


def test_the_design_map_is_the_tree_and_the_contract():
    """Every module and sub-package of netreduce/ and every adapter is a room of the
    map in docs/design.md, in the layer pyproject.toml's contract puts it."""
    package = ROOT / "netreduce"
    tree = {p.stem for p in package.glob("*.py") if p.name != "__init__.py"}
    tree |= {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    tree |= {"_native"} | {name.split(".")[1] for name in check.frameworks()}
    rooms = _map_rooms()
    assert set(rooms) == tree, (sorted(set(rooms) - tree), sorted(tree - set(rooms)))
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c["layers"] for c in config["contracts"] if c["type"] == "layers")
    contract = {name.strip(): i + 1 for i, layer in enumerate(layers)
                for name in re.split(r"[|:]", layer)}
    assert contract == rooms, {k: (rooms.get(k), contract.get(k))
                               for k in set(rooms) | set(contract)
                               if rooms.get(k) != contract.get(k)}
    core = next(c["source_modules"] for c in config["contracts"]
                if c["name"] == "The core never imports a framework")
    adapters = {name.split(".")[1] for name in check.frameworks()}
    assert {m.split(".", 1)[1] for m in core} == tree - adapters - {"_native"}
