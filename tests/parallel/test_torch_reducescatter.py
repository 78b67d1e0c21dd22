"""netreduce.torch's reducescatter family, checked the way Horovod 0.28's
test/parallel/test_torch.py checks horovod.torch's (test_horovod_reducescatter*):
values, Horovod's split of the first dimension, ops, scale factors, async fused
submissions, grouped calls, autograd, and Horovod's errors.

Run on every rank at once by tests/parallel/test_torch_launch.py (2 and 3 ranks).
"""
import itertools
import os

import pytest

torch = pytest.importorskip("torch")

from tests.parallel.launched import LAUNCHED, initialized_by, only_when_launched_by  # noqa: E402

if LAUNCHED:
    import netreduce.torch as hvd

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DTYPES = [torch.int32, torch.int64, torch.float16, torch.float32, torch.float64]
DIMS = [1, 2, 3]


initialized = initialized_by("netreduce.torch")


def _data(rank, dim, dtype, rows=None):
    gen = torch.Generator().manual_seed(1000 + rank)
    shape = [rows or 17] + [5] * (dim - 1)
    return torch.randint(-100, 100, shape, generator=gen).to(dtype)


def _shard(full, rank, size):
    """Horovod's split: the first rows % size ranks get one row more."""
    base, extra = divmod(full.shape[0], size)
    lo = rank * base + min(rank, extra)
    return full[lo:lo + base + (1 if rank < extra else 0)]


def _all(dim, dtype, size, rows=None):
    return [_data(r, dim, dtype, rows) for r in range(size)]


@pytest.mark.parametrize("dtype,dim", list(itertools.product(DTYPES, DIMS)))
def test_reducescatter_sum(dtype, dim):
    rank, size = hvd.rank(), hvd.size()
    data = _all(dim, dtype, size)
    out = hvd.reducescatter(data[rank], op=hvd.Sum, name=f"rs.sum.{dtype}.{dim}")
    expected = _shard(sum(d.double() for d in data), rank, size).to(dtype)
    assert out.dtype == dtype and out.shape == expected.shape
    tol = 1e-2 * size if dtype == torch.float16 else 1e-6
    assert torch.allclose(out.double(), expected.double(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_reducescatter_average(dtype):
    rank, size = hvd.rank(), hvd.size()
    data = _all(2, dtype, size)
    out = hvd.reducescatter(data[rank], name=f"rs.avg.{dtype}")  # Average by default
    total = sum(d.double() for d in data)
    if dtype in (torch.int32, torch.int64):  # Horovod: integer average truncates
        expected = (total / size).trunc()
    else:
        expected = total / size
    tol = 1e-2 if dtype == torch.float16 else 1e-6
    assert torch.allclose(out.double(), _shard(expected, rank, size), atol=tol, rtol=tol)


@pytest.mark.parametrize("rows", [1, 2, 5, 7])
def test_reducescatter_uneven_split(rows):
    """5 rows over 2 ranks: 3 and 2 (as Horovod 0.28.1-gloo returns); fewer rows
    than ranks: the last ranks get empty shards."""
    rank, size = hvd.rank(), hvd.size()
    x = torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2) + rank
    out = hvd.reducescatter(x, op=hvd.Sum, name=f"rs.rows{rows}")
    full = sum(torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2) + r
               for r in range(size))
    assert torch.equal(out, _shard(full, rank, size))
    base, extra = divmod(rows, size)
    assert out.shape[0] == base + (1 if rank < extra else 0)


def test_reducescatter_min_max():
    rank, size = hvd.rank(), hvd.size()
    data = _all(2, torch.float32, size)
    got_min = hvd.reducescatter(data[rank], op=hvd.Min, name="rs.min")
    got_max = hvd.reducescatter(data[rank], op=hvd.Max, name="rs.max")
    stack = torch.stack(data)
    assert torch.equal(got_min, _shard(stack.min(0).values, rank, size))
    assert torch.equal(got_max, _shard(stack.max(0).values, rank, size))


@pytest.mark.parametrize("pre,post", [(2.0, 1.0), (1.0, 0.5), (3.0, 0.25)])
def test_reducescatter_scale_factors(pre, post):
    rank, size = hvd.rank(), hvd.size()
    data = _all(1, torch.float64, size)
    out = hvd.reducescatter(data[rank], op=hvd.Sum, prescale_factor=pre,
                            postscale_factor=post, name=f"rs.scale.{pre}.{post}")
    expected = _shard(sum(d * pre for d in data) * post, rank, size)
    assert torch.allclose(out, expected)


def test_reducescatter_async_fused():
    """Many async submissions at once: poll() is False before the others have
    submitted, every result right after synchronize()."""
    rank, size = hvd.rank(), hvd.size()
    handles = []
    for dtype, dim in itertools.product(DTYPES, DIMS):
        data = _all(dim, dtype, size)
        handles.append((hvd.reducescatter_async(data[rank], op=hvd.Sum,
                                                name=f"rs.async.{dtype}.{dim}"), data, dtype))
    for h, data, dtype in handles:
        out = hvd.synchronize(h)
        expected = _shard(sum(d.double() for d in data), rank, size).to(dtype)
        assert torch.allclose(out.double(), expected.double(), atol=1e-2 * size)
    # rank 0 submits first; the others only after a barrier that rank 0 enters
    # after polling: its first polls must say "not done"
    if rank == 0:
        pending = hvd.reducescatter_async(torch.ones(4), name="rs.async.late")
        assert hvd.poll(pending) is False
        hvd.barrier()
    else:
        hvd.barrier()
        pending = hvd.reducescatter_async(torch.ones(4), name="rs.async.late")
    assert torch.equal(hvd.synchronize(pending), _shard(torch.ones(4), rank, size))


def test_grouped_reducescatter():
    rank, size = hvd.rank(), hvd.size()
    a, b = _all(1, torch.float32, size), _all(3, torch.float32, size, rows=6)
    outs = hvd.grouped_reducescatter([a[rank], b[rank]], op=hvd.Sum, name="rs.grouped")
    assert torch.equal(outs[0], _shard(sum(a), rank, size))
    assert torch.allclose(outs[1], _shard(sum(b), rank, size))
    h = hvd.grouped_reducescatter_async([a[rank], b[rank]], name="rs.grouped.async")
    outs = hvd.synchronize(h)
    assert torch.allclose(outs[1], _shard(sum(b) / size, rank, size))


@pytest.mark.parametrize("op,factor", [("Sum", "size"), ("Average", 1)])
def test_reducescatter_grad(op, factor):
    """Horovod's gradient: allgather of the gradient, times size() for Sum."""
    rank, size = hvd.rank(), hvd.size()
    x = torch.ones(2 * size + 1, 3, requires_grad=True)
    y = hvd.reducescatter(x, op=getattr(hvd, op), name=f"rs.grad.{op}")
    (y * (rank + 1)).sum().backward()
    scale = size if factor == "size" else 1
    expected = torch.cat([torch.full_like(_shard(x, r, size), float(r + 1))
                          for r in range(size)]) * scale
    assert torch.equal(x.grad, expected)


def test_grouped_reducescatter_grad():
    rank, size = hvd.rank(), hvd.size()
    xs = [torch.ones(size, 2, requires_grad=True), torch.ones(size + 1, requires_grad=True)]
    ys = hvd.grouped_reducescatter(xs, op=hvd.Average, name="rs.ggrad")
    sum((y * (rank + 1)).sum() for y in ys).backward()
    for x in xs:
        expected = torch.cat([torch.full_like(_shard(x, r, size), float(r + 1))
                              for r in range(size)])
        assert torch.equal(x.grad, expected)


def test_reducescatter_scalar_error():
    with pytest.raises(ValueError, match="Reducescatter does not support scalar inputs"):
        hvd.reducescatter(torch.tensor(1.0))


def test_reducescatter_shape_mismatch_error():
    rank = hvd.rank()
    with pytest.raises(RuntimeError, match="Mismatched reducescatter tensor shapes"):
        hvd.reducescatter(torch.ones(4 + rank), name="rs.bad.shape")


def test_reducescatter_dtype_mismatch_error():
    rank = hvd.rank()
    dtype = torch.float32 if rank == 0 else torch.float64
    with pytest.raises(RuntimeError, match="Mismatched data types"):
        hvd.reducescatter(torch.ones(4, dtype=dtype), name="rs.bad.dtype")


def test_reducescatter_duplicate_name_error():
    h = hvd.reducescatter_async(torch.ones(4), name="rs.dup")
    with pytest.raises(ValueError, match="already being reduced"):
        hvd.reducescatter_async(torch.ones(4), name="rs.dup")
    hvd.synchronize(h)


# --- owner delivery at the aggregator (the in-network reduce-scatter) --------------------
PACKET_BYTES = 65536  # a result packet on loopback at most: 64 KiB of IP datagram
_OWNER = """
import json, numpy as np, netreduce as nr
from netreduce import api
nr.init()
r, n = nr.rank(), nr.size()
dp = api._communicator().dp
assert hasattr(dp, "reducescatter"), type(dp)
x = (np.arange(300_001, dtype=np.float32) % 89) * (r + 1)
def sent():
    jobs = [j for j in dp.counters()["jobs"].values() if not j.get("finished")]
    return (sum(j["bytes_out"] for j in jobs), sum(j["retransmitted_results"] for j in jobs))
nr.barrier(); b0, r0 = sent()
got = nr.api.reducescatter_async(x, op=nr.Sum, name="owner.rs").wait()
nr.barrier(); b1, r1 = sent()
full = nr.allreduce(x, op=nr.Sum, name="owner.ar")
nr.barrier(); b2, r2 = sent()
lo, cnt = api.shard_rows(x.shape[0], n, r)
assert np.array_equal(got, full[lo:lo + cnt])
print("BYTES", json.dumps([b1 - b0, b2 - b1, r1 - r0]), flush=True)
nr.shutdown()
"""


@pytest.mark.skipif(LAUNCHED, reason="starts its own job")
@pytest.mark.parametrize("ranks", [2, 3])
def test_reducescatter_owner_delivery_sends_each_rank_its_shard(ranks):
    """Through a unicast aggregator with the flat algorithm, the reduce-scatter's
    results leave the aggregator once (each shard to its owner, header-only
    notices to the others), against N copies for the all-reduce of the same data;
    the shard equals the all-reduce's rows."""
    import json
    import os
    import subprocess
    import sys
    from netreduce.switch import spawn
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # unicast: the daemon's default (--fanout segment) sends the all-reduce's results
    # once to the job's multicast group on loopback, which would hide the N copies
    switch = spawn(host="127.0.0.1", port=0, fanout="unicast")
    try:
        env = dict(os.environ, NETREDUCE_SWITCH=f"127.0.0.1:{switch.address[1]}",
                   NETREDUCE_ALGORITHM="flat", NETREDUCE_TIMEOUT="20", OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH"))
                                              if p))
        proc = subprocess.run([sys.executable, "-m", "netreduce.launcher", "-np", str(ranks),
                               "--", sys.executable, "-c", _OWNER], cwd=root, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=120)
    finally:
        switch.stop()
    assert proc.returncode == 0, proc.stdout[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if "BYTES" in ln)
    rs_bytes, ar_bytes, rs_resent = json.loads(line.split("BYTES", 1)[1])
    payload = 300_001 * 4
    # One copy + headers. Results resent to a rank that asked again (a loaded host
    # delays its acknowledgement) count in bytes_out too: at most a packet each.
    first = rs_bytes - rs_resent * PACKET_BYTES
    assert payload <= rs_bytes and first < 1.2 * payload, (rs_bytes, rs_resent, payload)
    assert ar_bytes >= ranks * payload, (ar_bytes, payload)          # a copy per rank


# every test above the owner-delivery one runs on the ranks of a launched job
for _name, _fn in list(globals().items()):
    if _name.startswith("test_") and "owner_delivery" not in _name:
        globals()[_name] = only_when_launched_by("tests/parallel/test_torch_launch.py")(_fn)


# --- side by side with Horovod 0.28.1 ------------------------------------------------------
_SAME_AS_HOROVOD = """
import json, os, torch
if os.environ.get("USE_HOROVOD") == "1":
    import horovod.torch as hvd
else:
    import netreduce.torch as hvd
hvd.init()
r, n = hvd.rank(), hvd.size()
out = {}
x = torch.arange(5 * 2, dtype=torch.float32).reshape(5, 2) + r
out["rs_sum"] = hvd.reducescatter(x, op=hvd.Sum).tolist()
out["rs_avg_int"] = hvd.reducescatter(torch.ones(7, dtype=torch.int32) * (r + 1)).tolist()
out["rs_scaled"] = hvd.reducescatter(torch.ones(4, dtype=torch.float64), op=hvd.Sum,
                                     prescale_factor=2.0, postscale_factor=0.25).tolist()
out["grouped"] = [t.tolist() for t in hvd.grouped_reducescatter([torch.ones(3), torch.ones(2, 2)],
                                                                 op=hvd.Sum)]
for op in ("Sum", "Average"):
    g = torch.ones(4, 3, requires_grad=True)
    y = hvd.reducescatter(g, op=getattr(hvd, op))
    (y * (r + 1)).sum().backward()
    out["rs_grad_" + op] = g.grad.tolist()
a = torch.ones(r + 1, 2, requires_grad=True)
y = hvd.allgather(a)
(y * torch.arange(y.shape[0]).unsqueeze(1)).sum().backward()
out["ag"] = y.tolist()
out["ag_grad"] = a.grad.tolist()
splits = torch.tensor([1 + (q + r) % 2 for q in range(n)], dtype=torch.int32)
t = torch.arange(int(splits.sum()), dtype=torch.float32) + 10 * r
o, rs = hvd.alltoall(t, splits=splits)
out["a2a"] = [o.tolist(), rs.tolist()]
try:
    hvd.reducescatter(torch.tensor(1.0))
except ValueError as e:
    out["rs_scalar"] = str(e)
print("SAME " + json.dumps({"rank": r, "out": out}), flush=True)
"""


def _run_same(cmd, extra):
    """{rank: the answers} of _SAME_AS_HOROVOD run as ``cmd`` (2 ranks)."""
    import json
    import subprocess
    env = dict(os.environ, OMP_NUM_THREADS="1", NETREDUCE_TIMEOUT="30",
               PYTHONPATH=os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run(cmd, cwd=_ROOT, env=dict(env, **extra), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    got = {}
    for line in proc.stdout.splitlines():
        if "SAME " in line:
            rec = json.loads(line.split("SAME ", 1)[1])
            got[rec["rank"]] = rec["out"]
    assert sorted(got) == [0, 1], proc.stdout[-3000:]
    return got


def horovod_answers():
    """Horovod's answers to _SAME_AS_HOROVOD under horovodrun, 2 ranks. They are a
    function of the script and of Horovod's, torch's and Python's versions: kept under
    ~/.cache/netreduce/horovod-answers keyed by those (horovodrun runs again when one
    changes; netreduce's side always runs). tests/prebuild.py runs this module in the
    background at the session's start, so a fresh machine computes them in idle time."""
    import hashlib
    import json
    import sys
    from importlib.metadata import version
    from tests.peers import require_horovodrun
    horovodrun = require_horovodrun()
    key = hashlib.sha256("\0".join([_SAME_AS_HOROVOD, version("horovod"), torch.__version__,
                                     sys.version]).encode()).hexdigest()[:32]
    cache = os.path.join(os.environ.get("NETREDUCE_CACHE") or os.path.expanduser("~/.cache/netreduce"),
                         "horovod-answers", f"reducescatter-{key}.json")
    if os.path.exists(cache):
        with open(cache) as f:
            return {int(r): v for r, v in json.load(f).items()}
    horovod = _run_same([horovodrun, "-np", "2", "--gloo", "-H", "localhost:2",
                         sys.executable, "-c", _SAME_AS_HOROVOD], {"USE_HOROVOD": "1"})
    os.makedirs(os.path.dirname(cache), exist_ok=True)
    with open(cache + f".{os.getpid()}.tmp", "w") as f:
        json.dump(horovod, f)
    os.replace(cache + f".{os.getpid()}.tmp", cache)
    return horovod


@pytest.mark.slow
@pytest.mark.skipif(LAUNCHED, reason="starts its own jobs")
def test_reducescatter_allgather_alltoall_match_horovod():
    """The same script under horovodrun (Horovod 0.28.1-gloo) and netreduce-run,
    2 ranks: every value, shape, gradient and the scalar error text agree."""
    import sys
    from tests import prebuild
    # the answers' background run, if one was started (tests/prebuild.py): then the
    # cache has them, or (that run failed) horovodrun runs here as without it
    prebuild.wait(prebuild.HOROVOD_ANSWERS)
    horovod = horovod_answers()
    ours = _run_same([sys.executable, "-m", "netreduce.launcher", "-np", "2", "--",
                      sys.executable, "-c", _SAME_AS_HOROVOD], {})
    for rank in (0, 1):
        for key, value in horovod[rank].items():
            assert ours[rank].get(key) == value, (rank, key, ours[rank].get(key), value)


if __name__ == "__main__":
    horovod_answers()
