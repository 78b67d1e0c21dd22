"""``import horovod.torch as hvd`` for Horovod's unmodified benchmark scripts
(benchmarks/overlap_step.py): NRBENCH_HVD says who answers.

    netreduce        netreduce.torch itself (the Horovod API)
    ddp:BACKEND      torch DDP on BACKEND (gloo, netreduce) behind Horovod's names
    ddp:netreduce:overlap  the same, with netreduce.torch.ddp_overlap(model)
    none             no communication at all: the same loop's compute alone
"""
import os
import sys

_WHO = os.environ.get("NRBENCH_HVD", "netreduce")
if _WHO == "netreduce":
    import netreduce.torch as _module
else:
    import ddp_as_horovod as _module  # noqa: E402  (benchmarks/overlap_site)
    _module.configure(_WHO)
sys.modules[__name__] = _module
