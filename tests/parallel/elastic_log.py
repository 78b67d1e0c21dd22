"""What the workers under netreduce-run's elastic driver share (elastic_worker.py,
mxnet_elastic_worker.py, tf_elastic_keras_worker.py): their record file, and the wait
for the driver's host update after a step the test changes the hosts at."""
import json
import os
import time
from typing import Callable

from netreduce import config
from netreduce.worker import elastic_member


def start_record() -> Callable[[dict], None]:
    """Opens $ELASTIC_OUT/<host>_<slot>.jsonl (appended: a restarted worker keeps its
    predecessor's lines), writes {"pid"} (the test's sign the worker started) and
    returns the function that writes one record a line."""
    name = config.get("NETREDUCE_ELASTIC_WORKER").replace(":", "_")
    log = open(os.path.join(os.environ["ELASTIC_OUT"], name + ".jsonl"), "a")

    def write(record: dict) -> None:
        log.write(json.dumps(record) + "\n")
        log.flush()

    write({"pid": os.getpid()})
    return write


def hold_for_update(timeout: float = 60.0) -> None:
    """Waits (at most ``timeout`` s) until the driver's host update has reached this
    worker: the test changes the hosts when it sees the step, and the change then takes
    effect at the next commit whatever the machine's load."""
    member = elastic_member.member()
    deadline = time.monotonic() + timeout
    while member.pending()[0] <= member.synced and time.monotonic() < deadline:
        time.sleep(0.05)
