"""start_timeline / stop_timeline (Horovod's run-time timeline control) with ranks as
threads on the fakes: each start writes a complete Chrome trace of what ran between
it and the stop, on rank 0 (every rank with {rank} in the path)."""
import json

import numpy as np

import netreduce as nr


def _names(path):
    with open(path) as f:
        events = json.load(f)  # stop_timeline closed the JSON array
    rows = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    return rows - {"(agreement rounds)"}, events  # the rounds' row: whenever rounds ran


def test_start_stop_and_restart_on_another_file(ranks, tmp_path):
    first, second = tmp_path / "first.json", tmp_path / "second.json"

    def rank_fn(r):
        nr.allreduce(np.ones(3, np.float32), name="before")  # not recorded
        nr.start_timeline(str(first), mark_cycles=True)
        nr.allreduce(np.ones(3, np.float32), name="in.first")
        nr.stop_timeline()
        nr.allreduce(np.ones(3, np.float32), name="between")  # stopped: not recorded
        nr.start_timeline(str(second))
        nr.start_timeline(str(second))  # twice: the first is closed, the file restarted
        nr.allreduce(np.ones(3, np.float32), name="in.second")
        nr.stop_timeline()

    ranks(2).run(rank_fn)
    tensors, events = _names(first)
    assert tensors == {"in.first"}
    assert {e["name"] for e in events if e["ph"] == "X"} >= {"negotiate", "allreduce"}
    assert _names(second)[0] == {"in.second"}


def test_per_rank_files(ranks, tmp_path):
    def rank_fn(r):
        nr.start_timeline(str(tmp_path / "t{rank}.json"))
        nr.allreduce(np.ones(2, np.float32), name="x")
        nr.stop_timeline()

    ranks(3).run(rank_fn)
    for r in range(3):
        assert _names(tmp_path / f"t{r}.json")[0] == {"x"}
