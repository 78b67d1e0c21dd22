"""netreduce.elastic: Horovod's state and run loop at a fixed job size."""
import pytest

from netreduce import elastic
from netreduce.errors import InvalidArgumentError, RankFailedError


class _Broadcast:
    """bcast_object as rank 0 would see it: returns what it is given."""

    def __init__(self):
        self.calls = 0

    def __call__(self, obj):
        self.calls += 1
        return obj


def test_object_state_commit_restore_sync():
    bcast = _Broadcast()
    state = elastic.ObjectState(bcast, lambda: 0, epoch=1, batch=5)
    state.epoch, state.batch = 2, 7
    state.restore()
    assert (state.epoch, state.batch) == (1, 5)
    state.epoch = 3
    state.commit()
    state.epoch = 9
    state.restore()
    assert state.epoch == 3
    state.sync()
    assert bcast.calls == 1 and state.epoch == 3


def test_run_restores_resets_and_runs_again_after_a_broken_job():
    state = elastic.ObjectState(_Broadcast(), lambda: 0, step=0)
    resets, attempts = [], []
    state.register_reset_callbacks([lambda: resets.append("callback")])

    def train(state):
        attempts.append(state.step)
        while state.step < 5:
            state.step += 1
            if state.step == 3:
                state.commit()
            if state.step == 4 and len(attempts) == 1:
                raise RankFailedError("rank 1 died", rank=1)
        return state.step

    run = elastic.run_fn(train, reset=lambda: resets.append("reset"))
    assert run(state) == 5
    assert attempts == [0, 3]  # the second attempt starts from the commit
    assert resets == ["reset", "callback"]


def test_run_does_not_retry_what_would_fail_again():
    state = elastic.ObjectState(_Broadcast(), lambda: 0)
    calls = []

    def train(state):
        calls.append(1)
        raise InvalidArgumentError("bad splits")
    with pytest.raises(InvalidArgumentError):
        elastic.run_fn(train, reset=lambda: calls.append("reset"))(state)
    assert calls == [1]
