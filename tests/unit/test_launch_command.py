"""netreduce-run's command line: the hand-off to netreduce.launcher.elastic (a stand-in
module here, whatever the real one does) when one of its flags is given, and only
then; the rank variables netreduce-run gives, horovodrun's among them."""
from __future__ import annotations

import sys
import types

from netreduce.launcher import command
from netreduce.launcher.hosts import Host, assign


def _fake_elastic(calls):
    mod = types.ModuleType("netreduce.launcher.elastic")

    def add_arguments(parser):
        parser.add_argument("--min-np", dest="min_np", type=int, default=None)

    def run(args, cmd):
        calls.append((args.min_np, args.np, cmd))
        return 7

    mod.add_arguments, mod.run = add_arguments, run
    return mod


def test_elastic_flags_hand_the_run_over(monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "netreduce.launcher.elastic", _fake_elastic(calls))
    assert command.run(["-np", "4", "--min-np", "2", "--", "python", "train.py"]) == 7
    assert calls == [(2, 4, ["python", "train.py"])]
    # without an elastic flag, the static launcher runs (here: `true` on this host)
    assert command.run(["-np", "1", "--switch", "127.0.0.1:9", "true"]) == 0
    assert len(calls) == 1


def test_rank_environment_has_horovodruns_variables():
    slots = assign([Host("a", 2), Host("b", 1)], 3)
    env = command.rank_environment({"KEEP": "1"}, slots[2], "10.0.0.1:4791", host_label=True)
    assert env["KEEP"] == "1" and env["NETREDUCE_SWITCH"] == "10.0.0.1:4791"
    assert {k: env[k] for k in env if k.startswith(("HOROVOD_", "NETREDUCE_"))} == {
        "HOROVOD_HOSTNAME": "b", "HOROVOD_RANK": "2", "HOROVOD_SIZE": "3",
        "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "1", "HOROVOD_CROSS_RANK": "1",
        "HOROVOD_CROSS_SIZE": "2", "NETREDUCE_SWITCH": "10.0.0.1:4791", "NETREDUCE_RANK": "2",
        "NETREDUCE_SIZE": "3", "NETREDUCE_LOCAL_RANK": "0", "NETREDUCE_LOCAL_SIZE": "1",
        "NETREDUCE_HOST_LABEL": "b"}
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"],
            env["GROUP_RANK"]) == ("2", "3", "0", "1", "1")
