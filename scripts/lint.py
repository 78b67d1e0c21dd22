#!/usr/bin/env python3
"""The linters, in the mode that passes on the tree as it is (each tool's baseline says
what is still owed; new code is held to the rules from its first line):

    python3 scripts/lint.py            # ruff, mypy, clang-format
    python3 scripts/lint.py --tidy     # + clang-tidy over native/ (minutes: -j to spread it)
    python3 scripts/lint.py ruff mypy  # only those

- ruff: pyproject.toml [tool.ruff] (pyflakes, pycodestyle, bugbear; per-file baseline);
- mypy: pyproject.toml [tool.mypy] (netreduce/; per-module baseline); its incremental cache
  under ~/.cache/netreduce/mypy, one per environment's installed versions (mypy_cache_dir);
- clang-format: native/.clang-format, every native source not in
  native/.clang-format-ignore (the baseline);
- clang-tidy: native/.clang-tidy (bugprone-*, performance-*), every native source but
  native/python/ (pybind11's glue: its by-value py::object parameters are the library's
  idiom, and each file takes half a minute to parse), reduce/kernels.cc (clang 14
  knows no "f16c" for __builtin_cpu_supports, which GCC builds with) and
  transport/xdp/xdp_program.cc (it includes the BPF object setup.py generates).

A tool that is not installed fails the run, naming how to get it (scripts/install.sh
test installs them all). Exit status: 0 when every tool passed.

    python3 scripts/lint.py --baseline  # rewrite the three baselines to what the tree owes

--baseline rewrites them after a change that owes more (or less); .ci/run runs the
linters, so a baseline that grows is a debt taken on: say so in the commit."""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from typing import Callable, Dict, List

ROOT = pathlib.Path(__file__).resolve().parents[1]
HOW = {"ruff": "pip install '.[lint]'", "mypy": "pip install '.[lint]'",
       "clang-format": "apt-get install clang-format", "clang-tidy": "apt-get install clang-tidy"}


def _tracked(*patterns: str) -> List[str]:
    out = subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    return out.split()


def _listed(path: pathlib.Path) -> set:
    return {line.strip() for line in path.read_text().splitlines()
            if line.strip() and not line.startswith("#")}


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} is not installed ({HOW[name]})")
    return found


def ruff() -> int:
    return subprocess.run([_tool("ruff"), "check", "--no-cache", "."], cwd=ROOT).returncode


def mypy_cache_dir() -> pathlib.Path:
    """mypy's incremental cache, kept under the project's cache (NETREDUCE_CACHE, else
    ~/.cache/netreduce) instead of the checkout's .mypy_cache: a clean checkout (CI's)
    otherwise type-checks netreduce/ and the third-party modules it imports from scratch
    (~30 CPU-s; ~1 s warm). One folder per set of installed distributions and versions,
    so that environments with other versions (the base interpreter beside a virtualenv)
    do not invalidate each other's, and a new virtualenv with the same versions finds
    its cache (mypy checks each cached module against its source's hash, whatever its
    path)."""
    import hashlib
    dists = sorted({entry for folder in sys.path if os.path.isdir(folder)  # name-version.dist-info
                    for entry in os.listdir(folder) if entry.endswith((".dist-info", ".egg-info"))})
    key = hashlib.sha256("\n".join([sys.version, *dists]).encode()).hexdigest()[:16]
    root = os.environ.get("NETREDUCE_CACHE") or os.path.expanduser("~/.cache/netreduce")
    return pathlib.Path(root, "mypy", key)


def mypy() -> int:
    return subprocess.run([_tool("mypy"), "--cache-dir", str(mypy_cache_dir())],
                          cwd=ROOT).returncode


def clang_format() -> int:
    tool = _tool("clang-format")
    skip = _listed(ROOT / "native" / ".clang-format-ignore")
    files = [f for f in _tracked("native/*.cc", "native/*.h", "native/*.c") if f not in skip]
    return subprocess.run([tool, "--dry-run", "-Werror", *files], cwd=ROOT).returncode


def clang_tidy(jobs: int) -> int:
    tool = _tool("clang-tidy")
    flags = ["-std=c++17", "-Inative", "-DNETREDUCE_HAVE_VERBS=1", "-DNETREDUCE_HAVE_ISAL=1",
             "-DNETREDUCE_HAVE_XDP=1", f"-I{sysconfig.get_paths()['include']}"]
    flags += [f"-I{d}" for d in ("/usr/include/libnl3",) if os.path.isdir(d)]
    skip = {"native/reduce/kernels.cc", "native/transport/xdp/xdp_program.cc"}
    files = [f for f in _tracked("native/*.cc") if not f.startswith("native/python/")
             and f not in skip]

    def one(path: str) -> int:
        run = subprocess.run([tool, "-quiet", path, "--", *flags], cwd=ROOT,
                             capture_output=True, text=True)
        if run.returncode:
            sys.stdout.write(run.stdout + run.stderr)
        return run.returncode

    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        return max(pool.map(one, files), default=0)


PYPROJECT = ROOT / "pyproject.toml"
FORMAT_IGNORE = ROOT / "native" / ".clang-format-ignore"


def _between(text: str, tool: str, body: str) -> str:
    """``text`` with the lines between pyproject.toml's '# baseline: TOOL' marker and
    '# end of the TOOL baseline' replaced by ``body``."""
    pattern = re.compile(rf"(# baseline: {tool}[^\n]*\n)(.*?)(# end of the {tool} baseline)", re.S)
    if not pattern.search(text):
        raise KeyError(f"pyproject.toml has no '# baseline: {tool}' ... '# end of the {tool} "
                       "baseline' markers")
    return pattern.sub(lambda m: m.group(1) + body + m.group(3), text)


def baseline() -> int:
    """Rewrite the ruff, mypy and clang-format baselines to what the tree owes now."""
    text = PYPROJECT.read_text()
    with tempfile.TemporaryDirectory() as tmp:  # the config without its baselines
        bare = pathlib.Path(tmp, "pyproject.toml")
        bare.write_text(_between(_between(text, "ruff", ""), "mypy", ""))
        found = subprocess.run([_tool("ruff"), "check", "--no-cache", "--config", str(bare),
                                "--output-format", "json", "--exit-zero", "."], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout
        typed = subprocess.run([_tool("mypy"), "--config-file", str(bare), "--no-error-summary"],
                               cwd=ROOT, capture_output=True, text=True).stdout
    codes: Dict[str, set] = collections.defaultdict(set)
    for hit in json.loads(found):
        rel = pathlib.Path(hit["filename"]).resolve().relative_to(ROOT).as_posix()
        if rel != "netreduce/__init__.py":  # its F401s are the rule's exception, above
            codes[rel].add(hit["code"])
    ruff_body = "".join(f'"{f}" = {json.dumps(sorted(c))}\n'.replace(", ", ", ")
                        for f, c in sorted(codes.items()))
    modules = sorted({line.split(":", 1)[0][:-3].replace("/", ".")
                      for line in typed.splitlines() if ": error:" in line})
    mypy_body = ("[[tool.mypy.overrides]]\nmodule = [\n"
                 + "".join(f'    "{m}",\n' for m in modules) + "]\nignore_errors = true\n"
                 if modules else "")
    PYPROJECT.write_text(_between(_between(text, "ruff", ruff_body), "mypy", mypy_body))
    tool = _tool("clang-format")
    unformatted = [f for f in _tracked("native/*.cc", "native/*.h", "native/*.c")
                   if subprocess.run([tool, "--dry-run", "-Werror", f], cwd=ROOT,
                                     capture_output=True).returncode]
    head = [line for line in FORMAT_IGNORE.read_text().splitlines() if line.startswith("#")]
    FORMAT_IGNORE.write_text("\n".join(head + unformatted) + "\n")
    print(f"lint: baselines: ruff {len(codes)} files, mypy {len(modules)} modules, "
          f"clang-format {len(unformatted)} files")
    return 0


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tools", nargs="*", help="ruff, mypy, clang-format, clang-tidy (default: "
                   "all but clang-tidy)")
    p.add_argument("--tidy", action="store_true", help="also run clang-tidy")
    p.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1,
                   help="clang-tidy processes at once")
    p.add_argument("--baseline", action="store_true",
                   help="rewrite the baselines to what the tree owes now, then exit")
    args = p.parse_args(argv)
    if args.baseline:
        return baseline()
    tools: Dict[str, Callable[[], int]] = {
        "ruff": ruff, "mypy": mypy, "clang-format": clang_format,
        "clang-tidy": lambda: clang_tidy(args.jobs)}
    chosen = args.tools or ["ruff", "mypy", "clang-format"] + (["clang-tidy"] if args.tidy else [])
    failed = []
    for name in chosen:
        print(f"lint: {name}", flush=True)
        try:
            code = tools[name]()
        except (FileNotFoundError, KeyError) as exc:
            print(f"lint: {name}: {exc}", file=sys.stderr)
            code = 1
        if code:
            failed.append(name)
    print(f"lint: {'failed: ' + ', '.join(failed) if failed else 'all passed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
