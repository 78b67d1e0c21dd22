"""process_sets.on_process_set: the adapters' collectives find their process_set=
argument by position or keyword (read once from the signature, not bound per call)
and run on that set; the global set passes straight through."""
import pytest

from netreduce.errors import InvalidArgumentError
from netreduce.worker import process_sets as ps


@ps.on_process_set
def collective(tensor, name=None, op=None, process_set=ps.global_process_set):
    return (tensor, name, op, ps.current())


def test_the_default_and_the_global_set_run_on_the_job():
    assert collective(1) == (1, None, None, ps.global_process_set)
    assert collective(1, "n", "op", ps.global_process_set)[3] is ps.global_process_set
    assert collective(1, process_set=ps.global_process_set)[3] is ps.global_process_set


@pytest.mark.parametrize("call", [lambda bad: collective(1, "n", "op", bad),
                                  lambda bad: collective(1, process_set=bad)],
                         ids=["positional", "keyword"])
def test_the_set_is_read_by_position_and_by_keyword(call):
    with pytest.raises(InvalidArgumentError, match="must be a ProcessSet"):
        call([0, 1])
    with pytest.raises(InvalidArgumentError, match="not registered"):
        call(ps.ProcessSet([0]))


def test_arguments_the_function_refuses_still_raise_typeerror():
    with pytest.raises(TypeError):
        collective(1, bogus=2)
    with pytest.raises(TypeError):
        collective(1, "n", "op", ps.global_process_set, process_set=ps.global_process_set)


def test_a_keyword_only_set_is_read_from_the_keywords():
    @ps.on_process_set
    def grouped(*tensors, process_set=ps.global_process_set):
        return tensors
    assert grouped(1, 2) == (1, 2)
    with pytest.raises(InvalidArgumentError, match="must be a ProcessSet"):
        grouped(1, 2, process_set=[0])
