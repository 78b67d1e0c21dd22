"""horovod.common.util's version compare, which Horovod's Keras tests use to pick
code paths by TensorFlow version (test plumbing, not API under test)."""
from packaging import version


def is_version_greater_equal_than(ver: str, target: str) -> bool:
    return version.parse(ver) >= version.parse(target)
