import os


def scratch_testbed_name(tag: str) -> str:
    """A testbed name of this test run only (the tests pass replace=True, which must
    never tear down a testbed someone else brought up): 'n' + 5 hex digits of the
    pid + a one-letter tag, 7 characters within the 9 the interface names allow."""
    return f"n{os.getpid() & 0xFFFFF:05x}{tag}"
