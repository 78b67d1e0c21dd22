"""A granted payload larger than the path MTU fails with an error that says so and
names the fix, instead of silently timing out (datagrams carry DF)."""
from __future__ import annotations

import subprocess
import sys
import uuid

from tests.conftest import require_root

SCRIPT = r"""
import numpy as np
from netreduce import dataplane
from netreduce.errors import DataPlaneError
from netreduce.switch import spawn
with spawn() as sw:  # default 65464-byte payloads
    with dataplane.connect(sw.address, "mtu", 0, 1, timeout=5.0) as conn:
        try:
            conn.allreduce(np.ones(10**5, np.float32))
            print("NO ERROR")
        except DataPlaneError as exc:
            print("ERROR", exc)
"""


def test_payload_above_mtu_is_reported():
    require_root("ip")
    ns = "nrmtu-" + uuid.uuid4().hex[:6]
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "mtu", "9000", "up"], check=True)
        out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", SCRIPT],
                             capture_output=True, text=True, timeout=60).stdout
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
    assert "ERROR" in out and "exceeds the path MTU" in out and "--payload-bytes" in out, out
