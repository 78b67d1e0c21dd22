import os
import time
from pathlib import Path


def scratch_testbed_name(tag: str) -> str:
    """A testbed name of this test run only (the tests pass replace=True, which must
    never tear down a testbed someone else brought up): 'n' + 5 hex digits of the
    pid + a one-letter tag, 7 characters within the 9 the interface names allow."""
    return f"n{os.getpid() & 0xFFFFF:05x}{tag}"


def wait_for_capture_file(pcap: Path, timeout: float) -> None:
    """Wait until a capture tool (tshark, dumpcap) has written its file's header --
    under load it takes seconds to start -- then a moment more: the header is written
    a little before the filter is live."""
    deadline = time.monotonic() + timeout
    while not (pcap.exists() and pcap.stat().st_size > 0) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pcap.exists(), f"no capture file {pcap} within {timeout:g} s"
    time.sleep(1.0)
