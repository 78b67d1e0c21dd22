"""Fixtures shared by the unit tests."""
import pytest

from tests.unit.harness import Ranks


@pytest.fixture
def ranks():
    """make(size, **knobs) -> Ranks: ranks as threads through the public API on the
    fakes (tests/unit/harness.py); every one made is closed at the end."""
    made = []

    def make(size, **knobs):
        r = Ranks(size, knobs)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()
