"""A user's wait puts a wake-up on the executor's queue only when the executor
would not see the submission without one (netreduce/worker/executor_wakes.py, ``owed``):
in the wait after backward, a wake per gradient still in flight was a thread
hand-off each."""
from netreduce.worker.wake_queue import WAKE, WakeQueue
from tests.unit.test_live_round import b_while_a_is_in_the_round


def test_a_wait_on_a_submission_the_executor_will_read_puts_no_wake(ranks):
    """The executor is inside a round carrying "a"; "b" is submitted meanwhile (no
    wake: the executor reads pending when the round returns). Waiting on either
    (Handle.wait's help) puts no wake-up either, and both are still reduced."""
    def wait_on_both(agreement, ha, hb):
        agreement.help(ha)                       # what ha.wait() runs first
        agreement.help(hb)

    _, results = b_while_a_is_in_the_round(ranks, wait_on_both)
    for out_a, out_b, queued, _ in results:
        assert (out_a == 3).all() and (out_b == 30).all()
        assert WAKE not in queued, queued


def _standalone_agreement():
    """An Agreement whose executor does not run (nothing takes from its queue), on a
    communicator that knows ids 0 and 1 for "a" and "b": route alone, deterministic."""
    from types import SimpleNamespace

    from netreduce.protocol.signature import Signature
    from netreduce.worker.agreement import Agreement

    sig = Signature("allreduce", "float32", (3,), "sum")
    cache = SimpleNamespace(id_of={"a": (0, sig), "b": (1, sig)}, hits=0)
    comm = SimpleNamespace(timeout_s=30.0, cache=cache)
    agreement = Agreement(comm, WakeQueue(), width=8, threshold=1 << 20)

    def submission(name):
        handle = SimpleNamespace(_helper=None)
        return SimpleNamespace(name=name, sig=sig, kind="allreduce", handle=handle, seq=-1)

    return agreement, submission


def test_a_submission_behind_a_wake_not_yet_taken_puts_none():
    """Two submissions while the executor has not taken the first one's wake-up:
    one wake-up queued (it reads pending after taking it), both pending."""
    agreement, submission = _standalone_agreement()
    assert agreement.route([submission("a")]) == []
    assert agreement.route([submission("b")]) == []
    assert list(agreement.q.queue) == [WAKE]
    assert sorted(agreement.pending) == [0, 1]


def test_a_submission_after_the_wake_was_taken_puts_one():
    agreement, submission = _standalone_agreement()
    agreement.route([submission("a")])
    assert agreement.q.get_nowait() is WAKE       # the executor took it
    agreement.route([submission("b")])
    assert list(agreement.q.queue) == [WAKE]


def _armed_on_a(agreement):
    """The speculation armed on "a" alone (id 0), its user waiting for each step:
    the state in which route leaves the next submission of "a" to the user's wait."""
    spec = agreement.spec
    spec.ids, spec.idset, spec.waited = (0,), frozenset({0}), True


def test_a_submission_is_left_to_a_wait_only_while_the_executor_polls():
    """Left to the user's wait (no wake-up, ``owed``) only while the executor looks
    at pending every POLL_S; then it polls for a second more after that submission."""
    agreement, submission = _standalone_agreement()
    _armed_on_a(agreement)
    agreement.wakes.polls = True
    assert agreement.route([submission("a")]) == []
    assert list(agreement.q.queue) == [] and agreement.wakes.owed
    assert agreement.wakes.polling(agreement.spec.armed)


def test_a_submission_nobody_may_wait_for_wakes_an_executor_that_does_not_poll():
    """After a loop of one-call steps (Agreement.steady: nothing left to a wait, so
    the executor does not poll), an async submission of the same tensor wakes the
    executor at once: nobody may wait for it, and without the poll it would sit
    until the idle pace (IDLE_S or more) brought the executor back. It is marked as
    left-able, so the executor polls from its next look on."""
    agreement, submission = _standalone_agreement()
    _armed_on_a(agreement)
    agreement.wakes.polls = False            # (nothing left to a wait for a second)
    assert agreement.route([submission("a")]) == []
    assert list(agreement.q.queue) == [WAKE] and not agreement.wakes.owed
    assert sorted(agreement.pending) == [0]
    assert agreement.wakes.polling(agreement.spec.armed)   # the pattern seen: poll


def test_wake_ups_a_user_thread_cleared_are_paid_unless_the_executor_polls():
    """A user thread's message cleared wake-ups put for another thread's submission
    (``owed``), which nobody may wait for: with the executor not polling, it wakes
    the executor itself; with the executor polling, the poll sees the submission."""
    for polls, queued in ((False, [WAKE]), (True, [])):
        agreement, submission = _standalone_agreement()
        agreement.route([submission("b")])
        assert agreement.q.clear_wakes() is True   # cleared by the user thread's message
        agreement.wakes.owed, agreement.wakes.polls = True, polls
        agreement.wakes.settle(agreement.pending)
        assert list(agreement.q.queue) == queued and agreement.wakes.owed is polls


def test_a_wait_that_owes_a_wake_puts_none_behind_one_not_yet_taken():
    """A wait about to block pays the wake-up it owes (``owed``) with the queue's
    deduplicating wake: behind a wake-up the executor has not taken yet, a second
    would ask nothing more (the executor reads pending after taking the first)."""
    import threading
    from types import SimpleNamespace

    agreement, submission = _standalone_agreement()
    agreement.route([submission("a")])               # the executor not polling: a wake
    assert list(agreement.q.queue) == [WAKE]
    agreement.wakes.owed = True                      # e.g. "b" left to this wait
    agreement.help(SimpleNamespace(_event=threading.Event()))
    assert list(agreement.q.queue) == [WAKE] and not agreement.wakes.owed
    assert agreement.wakes.help_wakes == 1
