"""The coordinator's side of membership epochs (switch/epochs.py): a hello of a later
epoch starts the job's next negotiation run and fails the old one at once (its ranks
waiting at hello learn why); a hello of an earlier epoch is refused."""
import pytest

from netreduce.protocol import messages
from netreduce.switch import coordinator
from netreduce.switch.commands import RequestError
from netreduce.switch.waits import Wait, resolve


class _Srv:
    pass


class _Sess:
    def __init__(self):
        self.state = {}


def _hello(srv, rank, size, epoch, job="j"):
    return coordinator.handle_hello(srv, _Sess(), messages.NegotiateHello(
        job=job, rank=rank, size=size, epoch=epoch, role="all", timeout=5))


def test_a_later_epoch_replaces_the_run_and_fails_the_old_one():
    srv = _Srv()
    waiting = _hello(srv, 0, 3, 1)  # epoch 1 waits for ranks 1 and 2, which never come
    assert isinstance(waiting, Wait)
    moved = [_hello(srv, r, 2, 2) for r in range(2)]
    with pytest.raises(RequestError, match="moved to membership epoch 2 .world size 3 -> 2"):
        resolve(waiting)
    assert [resolve(w).size for w in moved] == [2, 2]
    with pytest.raises(RequestError, match="moved on to epoch 2"):
        _hello(srv, 2, 3, 1)


def test_a_rank_that_left_its_epoch_cannot_say_hello_in_it_again():
    srv = _Srv()
    sess = _Sess()
    wait = coordinator.handle_hello(srv, sess, messages.NegotiateHello(
        job="k", rank=0, size=1, epoch=4, role="all", timeout=5))
    resolve(wait)
    coordinator.handle_bye(srv, sess, messages.NegotiateBye(done=-1))
    with pytest.raises(RequestError, match="already left membership epoch 4"):
        _hello(srv, 0, 1, 4, job="k")
    assert resolve(_hello(srv, 0, 1, 5, job="k")).size == 1


def test_jobs_without_epochs_keep_the_restart_rule():
    srv = _Srv()
    sess = _Sess()
    resolve(coordinator.handle_hello(srv, sess, messages.NegotiateHello(
        job="m", rank=0, size=1, role="all", timeout=5)))
    coordinator.handle_bye(srv, sess, messages.NegotiateBye(done=-1))
    assert resolve(_hello(srv, 0, 1, 0, job="m")).size == 1  # the next run
