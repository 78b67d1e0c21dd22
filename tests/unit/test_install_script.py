"""The README says what `scripts/install.sh main` and `test` install -- every Debian
package and every Python package the scripts name -- and install.sh says what each
long step does before it starts (issue 35: the README did not say that install.sh
installs Debian packages, and the install printed nothing for a minute)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPTS = [ROOT / "scripts" / "install.sh", *sorted((ROOT / "scripts").glob("env_*.sh")),
           ROOT / "scripts" / "softroce" / "prepare.sh"]


def _readme_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("### What the install commands install")
    return text[start:text.index("\n## ", start)]


def _debian_packages(text: str) -> set:
    found = set()
    for body in re.findall(r"(?:apt_pkgs|pkgs|missing)\+=\(([^)]*)\)", text):
        found.update(w for w in body.split() if re.fullmatch(r"[a-z0-9][a-z0-9.+-]+", w))
    found.update(re.findall(r"^\s*need \S+ (\S+)\s*$", text, re.M))  # need CMD PACKAGE
    found.update(re.findall(r"\S+\.so(?:\.\d+)*:([a-z0-9.+-]+)", text))  # lib.so.N:package
    found.update(re.findall(r"apt-get install -y -qq ([a-z0-9][a-z0-9.+-]+)", text))
    if "linux-image-" in text:
        found.add("linux-image-*-amd64")
    return found


def _python_packages(text: str) -> set:
    found = set(re.findall(r'"([A-Za-z][\w.-]*)(?:\[\w+\])?(?:==|>=)[^"]*"', text))
    for command in re.split(r"[;\n]", text):
        if "pip install" not in command or re.search(r"\b(say|echo)\b", command):
            continue  # (what a step says it installs is not what it installs)
        tail = command.split("pip install", 1)[1].replace("}", " ").split()
        if "-e" not in tail:
            found.update(w for w in tail if re.fullmatch(r"[a-z][\w-]*", w))
    for body in re.findall(r"runtime_deps=\(([^)]*)\)", text):
        found.update(body.split())
    return found - {"q", "y", "install"}


def _install_requires() -> set:
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "install_requires":
            return {re.split(r"[<>=\[ ]", e.value)[0] for e in node.value.elts}
    raise AssertionError("setup.py has no install_requires")


def test_the_readme_lists_every_package_the_install_scripts_install():
    section = _readme_section()
    listed = set(re.findall(r"`([^`]+)`", section))
    debian = set().union(*(_debian_packages(p.read_text()) for p in SCRIPTS))
    assert {"clang", "libxdp-dev", "libibverbs-dev", "iperf3", "ethtool", "python3-simgrid",
            "linux-image-*-amd64"} <= debian  # the parser finds what the issue named
    missing = sorted(p for p in debian if p not in listed)
    assert not missing, f"Debian packages installed but not in the README's list: {missing}"
    python = set().union(*(_python_packages(p.read_text()) for p in SCRIPTS))
    assert {"torch", "atheris", "tensorflow-cpu", "mxnet", "torchvision"} <= python
    words = {w.lower() for w in re.findall(r"[\w.+-]+", section)}
    missing = sorted(p for p in python | _install_requires() if p.lower() not in words)
    assert not missing, f"Python packages installed but not in the README's list: {missing}"


def test_install_sh_says_what_each_long_step_does_before_it_starts():
    lines = (ROOT / "scripts" / "install.sh").read_text().splitlines()
    code = [ln for ln in lines if ln.strip() and not ln.strip().startswith("#")]
    silent = []
    for i, line in enumerate(code):
        if re.search(r"pip install|apt-get install|bash \"\$env_script\"", line):
            before = " ".join(code[max(0, i - 2):i + 1])
            if "say " not in before:
                silent.append(line.strip())
    assert not silent, f"steps that start without saying what they do: {silent}"
