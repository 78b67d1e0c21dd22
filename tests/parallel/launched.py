"""For test files that run on every rank at once: they only make sense under a
launcher, and tests/parallel/test_torch_launch.py starts them under netreduce-run."""
import pytest

from netreduce.environment import discover

LAUNCHED = discover().size > 1
only_when_launched = pytest.mark.skipif(
    not LAUNCHED, reason="multi-rank test: run by tests/parallel/test_torch_launch.py "
                         "under netreduce-run")
