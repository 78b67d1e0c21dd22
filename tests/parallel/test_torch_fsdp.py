"""PyTorch FSDP on the "netreduce" backend against the same run on gloo.

examples/pytorch_fsdp.py trains a small transformer with FullyShardedDataParallel
(and FSDP2's fully_shard) under netreduce-run; its all-gathers and reduce-scatters
go through the aggregator. The loss must fall (the example's exit code) and the
final parameters must match a gloo run (the netreduce run uses the flat algorithm,
so that its reduce-scatters are the aggregator's owner-delivered ones): bit for bit with 2 ranks (a sum of two
floats does not depend on their order), to float32 rounding with 4 (the aggregator
adds in arrival order, gloo in its ring's).
"""
import hashlib
import os
import pathlib
import subprocess
import sys
import tempfile

import pytest

torch = pytest.importorskip("torch")

from netreduce.environment import discover  # noqa: E402
from tests import prebuild  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "pytorch_fsdp.py")
STEPS = 8
CACHE = os.path.join(os.environ.get("NETREDUCE_CACHE") or os.path.expanduser("~/.cache/netreduce"),
                     "fsdp-gloo")


def _run(ranks, backend, flavour, out):
    # flat: every rank's data through the aggregator (on one host the default would
    # reduce in shared memory), so reduce-scatters are owner-delivered there
    env = dict(os.environ, OMP_NUM_THREADS="1", NETREDUCE_TIMEOUT="30", NETREDUCE_ALGORITHM="flat",
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    cmd = [sys.executable, "-m", "netreduce.launcher", "-np", str(ranks), "--",
           sys.executable, EXAMPLE, "--backend", backend, "--steps", str(STEPS), "--save", str(out)]
    if flavour == "fsdp2":
        cmd.append("--fsdp2")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-5000:]
    assert "(fell)" in proc.stdout, proc.stdout[-3000:]
    return proc.stdout, torch.load(out)


def _gloo_reference(ranks, flavour, tmp_path):
    """The gloo run's final parameters. They are a function of the example, torch (its
    gloo) and the world alone, so they are kept under ~/.cache/netreduce/fsdp-gloo keyed
    by those: gloo runs again whenever one of them changes (a gloo run costs as much as
    the netreduce one, which always runs)."""
    with open(EXAMPLE, "rb") as f:
        key = hashlib.sha256(b"\0".join([f.read(), torch.__version__.encode(), sys.version.encode(),
                                         f"{ranks} {flavour} {STEPS}".encode()])).hexdigest()
    path = os.path.join(CACHE, key[:32] + ".pt")
    if os.path.exists(path):
        return torch.load(path)
    _, params = _run(ranks, "gloo", flavour, tmp_path / "gloo.pt")
    os.makedirs(CACHE, exist_ok=True)
    torch.save(params, path + f".{os.getpid()}.tmp")
    os.replace(path + f".{os.getpid()}.tmp", path)
    return params


RANKS, FLAVOURS = [2, 4], ["fsdp", "fsdp2"]


def _covered(ranks, flavour):
    return not (flavour == "fsdp2" and ranks == 4)


def fill_cache():
    """Every gloo reference the test reads, computed where missing: tests/prebuild.py
    runs this module in the background at the session's start (a fresh machine's ~35
    CPU-s, in the idle time of the tests before this one)."""
    for ranks in RANKS:
        for flavour in FLAVOURS:
            if _covered(ranks, flavour):
                with tempfile.TemporaryDirectory() as tmp:
                    _gloo_reference(ranks, flavour, pathlib.Path(tmp))


@pytest.mark.slow
@pytest.mark.skipif(discover().size > 1, reason="starts its own jobs")
@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("ranks", RANKS)
def test_fsdp_matches_gloo(tmp_path, flavour, ranks):
    if not _covered(ranks, flavour):
        pytest.skip("fully_shard is covered with 2 ranks; 4 adds only CPU time here")
    out_nr, params_nr = _run(ranks, "netreduce", flavour, tmp_path / "nr.pt")
    # the references' background run, if one was started (tests/prebuild.py): then
    # the cache has them, or (that run failed) gloo runs here as without it
    prebuild.wait(prebuild.FSDP_GLOO)
    params_gloo = _gloo_reference(ranks, flavour, tmp_path)
    # the collectives went through netreduce, not some fallback
    line = next(ln for ln in out_nr.splitlines() if "netreduce collectives:" in ln)
    assert int(line.split("collectives:")[1].split()[0]) > 0, line
    assert params_nr.keys() == params_gloo.keys()
    for name, value in params_nr.items():
        if ranks == 2:
            assert torch.equal(value, params_gloo[name]), name
        else:
            assert torch.allclose(value, params_gloo[name], rtol=1e-4, atol=1e-5), name


if __name__ == "__main__":
    fill_cache()
