"""The aggregator-side coordinator, driven in-process through its handlers."""
import threading
import time

import pytest

from netreduce.protocol import codec
from netreduce.switch import coordinator as coord
from netreduce.switch.waits import resolve


def _blocking(handler, cmd):
    """A handler called as the server calls it (the request decoded into its type,
    a Wait resolved on this thread); its reply as plain values, as on the wire."""
    return lambda srv, sess, fields: codec.to_builtins(
        resolve(handler(srv, sess, codec.build(cmd, **fields))))


hello_, negotiate_, watch_ = (_blocking(coord.handle_hello, "negotiate_hello"),
                              _blocking(coord.handle_negotiate, "negotiate"),
                              _blocking(coord.handle_watch, "negotiate_watch"))
submit_ = _blocking(coord.handle_submit, "negotiate_submit")
bye_ = _blocking(coord.handle_bye, "negotiate_bye")


class Srv:
    pass


class Sess:
    def __init__(self):
        self.state = {}


def req(name, shape=(4,), dtype="float32", kind="allreduce", op="sum", root=-1, pre=1.0,
        post=1.0):
    return {"name": name, "kind": kind, "dtype": dtype, "shape": list(shape), "op": op,
            "root": root, "prescale": pre, "postscale": post}


@pytest.fixture
def job():
    """Two ranks joined (hello runs concurrently: it waits for everyone)."""
    srv = Srv()
    sessions = [Sess() for _ in range(2)]
    submit = [Sess() for _ in range(2)]

    def hello(r):
        hello_(srv, submit[r], {"job": "j", "rank": r, "size": 2, "role": "submit",
                                            "threshold": 1000})
        hello_(srv, sessions[r], {"job": "j", "rank": r, "size": 2, "role": "poll",
                                              "threshold": 1000, "timeout": 5})

    ts = [threading.Thread(target=hello, args=(r,)) for r in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return srv, sessions, submit


def neg(srv, sess, reqs=(), ack=0, wait_ms=0, stall_s=60.0):
    return negotiate_(srv, sess, {"reqs": list(reqs), "ack": ack, "wait_ms": wait_ms,
                                              "stall_s": stall_s})


def test_one_order_for_any_submission_order(job):
    srv, s, _ = job
    assert neg(srv, s[0], [req("a"), req("b"), req("c", dtype="float64")])["entries"] == []
    reply = neg(srv, s[1], [req("c", dtype="float64"), req("b"), req("a")])
    # readiness order is rank 1's order; same-dtype tensors fuse in that order
    groups = [e["tensors"] for e in reply["entries"]]
    names = {v: k for k, v in reply["entries"][0].get("assign", {}).items()}
    for e in reply["entries"][1:]:
        names.update({v: k for k, v in e.get("assign", {}).items()})
    assert [[names[x] for x in g] for g in groups] == [["c"], ["b", "a"]]
    assert [e["seq"] for e in reply["entries"]] == [0, 1]
    # rank 0 reads the very same entries
    assert neg(srv, s[0], ack=0)["entries"] == reply["entries"]


def test_cached_ids_replace_requests(job):
    srv, s, _ = job
    neg(srv, s[0], [req("w")])
    first = neg(srv, s[1], [req("w")])["entries"][0]
    wid = first["assign"]["w"]
    neg(srv, s[0], [wid], ack=1)
    again = neg(srv, s[1], [wid], ack=1)["entries"]
    assert again == [{"tensors": [wid], "seq": 1}]  # no assignment, no name: a few bytes


def test_shape_mismatch_is_reported_with_values_and_ranks(job):
    srv, s, _ = job
    neg(srv, s[0], [req("x", shape=(2, 3))])
    entry = neg(srv, s[1], [req("x", shape=(3,))])["entries"][0]
    assert entry["error"].startswith(
        "Mismatched allreduce tensor shapes: One rank sent a tensor of shape [2, 3], "
        "but another rank sent a tensor of shape [3].")
    assert "Tensor 'x': rank 0 sent [2, 3]; rank 1 sent [3]." in entry["error"]


@pytest.mark.parametrize("a,b,expected", [
    (req("x", dtype="float32"), req("x", dtype="float64"),
     "Mismatched data types: One rank had type float32, but another rank had type float64."),
    (req("x", op="sum"), req("x", op="max"),
     "Mismatched allreduce reduction ops: One rank sent op sum, but another rank sent op max."),
    (req("x"), req("x", kind="broadcast", root=0),
     "Mismatched operations: One rank did an allreduce, but another rank did a broadcast."),
    (req("x", kind="broadcast", root=0), req("x", kind="broadcast", root=1),
     "Mismatched broadcast root ranks: One rank specified root rank 0, but another rank "
     "specified root rank 1."),
    (req("x", pre=2.0), req("x"),
     "Mismatched prescale factors: One rank sent factor 2.0, but another rank sent factor 1.0."),
    (req("x", post=2.0), req("x"),
     "Mismatched postscale factors: One rank sent factor 2.0, but another rank sent factor 1.0."),
])
def test_every_mismatch_kind(job, a, b, expected):
    srv, s, _ = job
    neg(srv, s[0], [a])
    err = neg(srv, s[1], [b])["entries"][0]["error"]
    # Horovod's sentence, then the tensor and which rank sent what
    assert err.startswith(expected + " Tensor 'x': rank 0 sent "), err
    assert "; rank 1 sent " in err and err.endswith("."), err


def test_stall_report_names_missing_ranks(job):
    srv, s, _ = job
    neg(srv, s[0], [req("lonely")])
    time.sleep(0.06)
    reply = neg(srv, s[0], ack=0, stall_s=0.05)
    assert reply["stalls"][0]["name"] == "lonely" and reply["stalls"][0]["missing"] == [1]
    assert not neg(srv, s[0], stall_s=0.05)["stalls"]  # warned once


def test_long_poll_wakes_when_the_last_rank_submits(job):
    srv, s, sub = job
    neg(srv, s[0], [req("a")])
    got = {}
    t = threading.Thread(target=lambda: got.update(neg(srv, s[0], wait_ms=5000)))
    t0 = time.monotonic()
    t.start()
    time.sleep(0.05)
    submit_(srv, sub[1], {"reqs": [req("a")]})
    t.join(5)
    assert got["entries"] and time.monotonic() - t0 < 2


def test_disconnect_fails_the_job_naming_the_rank(job):
    srv, s, sub = job
    neg(srv, s[0], [req("a")])
    coord.on_disconnect(srv, s[1])
    reply = neg(srv, s[0])
    assert reply["failure"]["rank"] == 1 and "rank 1 disconnected" in reply["failure"]["message"]
    assert reply["failure"].get("after") is None


def test_bye_lets_entries_it_executed_finish(job):
    srv, s, sub = job
    neg(srv, s[0], [req("a")])
    neg(srv, s[1], [req("a")])  # seq 0 in the log, executed by rank 1
    bye_(srv, sub[1], {"done": 0})
    f = neg(srv, s[0])["failure"]
    assert f["after"] == 0 and f["rank"] == 1 and "rank 1 called shutdown()" in f["message"]
    # what happened, told to every rank that stays: no claim about what each had pending
    assert "still had operations" not in f["message"], f["message"]


def test_job_is_forgotten_when_everyone_left(job):
    srv, s, sub = job
    for conn in s + sub:
        coord.on_disconnect(srv, conn)
    assert "j" not in coord._jobs(srv)


def test_hello_times_out_naming_missing_ranks():
    srv = Srv()
    with pytest.raises(coord.RequestError, match="ranks 1, 2 of job 'lone' did not join"):
        hello_(srv, Sess(), {"job": "lone", "rank": 0, "size": 3, "timeout": 0.1})


def test_same_rank_twice_is_refused(job):
    srv, _, _ = job
    with pytest.raises(coord.RequestError, match="rank 0 of job 'j' is already connected"):
        hello_(srv, Sess(), {"job": "j", "rank": 0, "size": 2, "role": "poll"})


def test_log_is_trimmed_once_everyone_read_it(job):
    srv, s, _ = job
    neg(srv, s[0], [req("a")])
    neg(srv, s[1], [req("a")])
    neg(srv, s[0], ack=1)
    neg(srv, s[1], ack=1)
    state = coord._jobs(srv)["j"]
    assert state.log == [] and state.base == 1


# --- join (Horovod's uneven inputs) ------------------------------------------------------
def join_req():
    return {"name": "__join__", "kind": "join", "dtype": "int64", "shape": [1], "op": "",
            "cacheable": False}


def test_joined_rank_counts_as_submitting_and_gets_the_signature(job):
    srv, s, _ = job
    assert neg(srv, s[0], [join_req()])["entries"] == []
    reply = neg(srv, s[1], [req("a", shape=(2, 3), op="average"), req("b", dtype="int32")])
    entries = reply["entries"]
    # both tensors ready without rank 0; rank 0 learns from "z" what to send zeros for
    assert len(entries) == 2
    zs = [z for e in entries for z in e["zeros"]]
    assert {(z["name"], z["dtype"], tuple(z["shape"]), z["op"]) for z in zs} == \
        {("a", "float32", (2, 3), "average"), ("b", "int32", (4,), "sum")}
    assert neg(srv, s[0], ack=0)["entries"] == entries  # the same log for the joined rank
    # rank 1 joins last: the join entry names it, and the join state resets
    last = neg(srv, s[1], [join_req()], ack=2)["entries"]
    assert last == [{"tensors": ["__join__"], "last": 1, "seq": 2}]
    state = coord._jobs(srv)["j"]
    assert state.join_ranks == set()
    neg(srv, s[0], [req("c")], ack=3)
    assert "zeros" not in neg(srv, s[1], [req("c")], ack=3)["entries"][0]  # normal again


def test_join_releases_what_only_waited_for_the_joining_rank(job):
    srv, s, _ = job
    neg(srv, s[1], [req("x"), req("y")])
    neg(srv, s[0], [req("x")])  # x ready; y waits for rank 0
    entries = neg(srv, s[0], [join_req()], ack=1)["entries"]
    assert entries[-1]["zeros"][0]["name"] == "y"  # y released by rank 0's join, before the join


def test_broadcast_and_allgather_fail_while_a_rank_is_joined(job):
    srv, s, _ = job
    neg(srv, s[0], [join_req()])
    entries = neg(srv, s[1], [req("bc", kind="broadcast", root=1),
                              req("ag", kind="allgather")])["entries"]
    errs = {e["tensors"][0]: e["error"] for e in entries}
    assert errs["bc"].startswith("Broadcast is not supported with Join at this time.")
    assert errs["ag"].startswith("Allgather is not supported with Join at this time.")
    assert "rank(s) 0 have joined" in errs["bc"]


def test_joined_rank_is_not_reported_as_stalled(job):
    srv, s, _ = job
    neg(srv, s[0], [join_req()])
    time.sleep(0.06)
    assert not neg(srv, s[0], stall_s=0.05)["stalls"]
