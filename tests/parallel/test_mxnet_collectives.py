"""netreduce.mxnet's allgather, alltoall, reducescatter (plain and grouped) and process
sets under netreduce-run with 2 and 3 ranks, in MXNet's environment: every rank runs
tests/parallel/mxnet_collective_ranks.py with the venv's python."""
import pytest

from netreduce.environment import discover
from tests.parallel.mxnet_env import run_ranks_file

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(discover().size > 1, reason="already running under a launcher")]


@pytest.mark.parametrize("ranks", [2, 3])
def test_mxnet_collectives(ranks):
    run_ranks_file("mxnet_collective_ranks.py", ranks, at_least=40, timeout=400)
