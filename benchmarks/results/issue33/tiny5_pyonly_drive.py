# ruff: noqa
# tiny5 (12-07), from tiny4_pyonly_drive.py: a scratch script of BENCHMARKS.md "4 KiB all-reduce at N=4 on the AMD boot", kept as it ran.
import sys
import subprocess
import os
import uuid
code = sys.argv[1]
sys.path.insert(0, os.path.join(code, "benchmarks"))
import control_plane as cp
sw, addr = cp._spawn_switch(code)
job = uuid.uuid4().hex[:8]
ps = []
for r in range(2):
    env = dict(os.environ, PYTHONPATH=code, NETREDUCE_RANK=str(r), NETREDUCE_SIZE="2", NETREDUCE_LOCAL_RANK=str(r), NETREDUCE_LOCAL_SIZE="2", NETREDUCE_SWITCH=addr, NETREDUCE_JOB=job, NETREDUCE_ALGORITHM="auto", NETREDUCE_CYCLE_TIME="1", NETREDUCE_CACHE_AGREEMENT="1")
    ps.append(subprocess.Popen([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny5_pyonly.py")], env=env, cwd=code, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
for p in ps:
    o, e = p.communicate(timeout=300); print(o.strip(), e[-500:] if p.returncode else "")
sw.terminate(); sw.wait()
