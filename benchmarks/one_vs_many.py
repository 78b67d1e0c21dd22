#!/usr/bin/env python3
"""Does a message boundary cost link time? (issue 33, the hvd step's "engine rate")

N=4 ranks on the testbed (1 Gbit/s, MTU 9000) all-reduce resnet18's 46.76 MB of
float32 gradients as ONE engine message, and in the pipeline's shape (the tensors
under 256 KiB as one message, each larger one alone: 15 messages submitted back to
back with allreduce_async, then waited for), alternating per iteration; rank 0
prints the seconds of each as JSON. As root:

    python3 benchmarks/one_vs_many.py drive TESTBED_NAME SUBNET ITERS CODE_DIR
"""
import json
import sys
import time

import numpy as np

# torchvision resnet18's parameters, in model order
SIZES = ([9408, 64, 64] + [36864, 64, 64] * 4
         + [73728, 128, 128, 147456, 128, 128, 8192, 128, 128, 147456, 128, 128, 147456, 128, 128]
         + [294912, 256, 256, 589824, 256, 256, 32768, 256, 256, 589824, 256, 256, 589824, 256, 256]
         + [1179648, 512, 512, 2359296, 512, 512, 131072, 512, 512, 2359296, 512, 512, 2359296,
            512, 512] + [512000, 1000])


def rank_main(host, port, rank, size, iters, code):
    sys.path.insert(0, code)
    from netreduce.worker import dataplane
    conn = dataplane.connect((host, int(port)), job="probe", rank=rank, size=size, timeout=60)
    flat = np.ones(sum(SIZES), np.float32)
    big = [np.ones(n, np.float32) for n in SIZES if n * 4 >= 256 << 10]
    small = np.ones(sum(n for n in SIZES if n * 4 < 256 << 10), np.float32)
    sync = np.ones(1, np.float32)
    out = {"one": [], "direct": []}
    for it in range(iters):
        for mode in (["one", "direct"] if it % 2 == 0 else ["direct", "one"]):
            conn.allreduce(sync)
            t0 = time.perf_counter()
            if mode == "one":
                conn.allreduce(flat)
            else:  # the pipeline's shape: small ones fused, each large alone
                reqs = [conn.allreduce_async(small)] + [conn.allreduce_async(a) for a in big]
                for r in reqs:
                    r.wait()
            out[mode].append(time.perf_counter() - t0)
    if rank == 0:
        print(json.dumps({"nbig": len(big), "bytes": sum(SIZES) * 4, **out}))
    conn.close()


def driver(name, subnet, iters, code):
    sys.path.insert(0, code)
    from netreduce.testbed import Testbed
    with Testbed(hosts=4, rate="1gbit", name=name, subnet=subnet, mtu=9000, replace=True) as tb:
        sw = tb.spawn_switch()
        host, port = sw.address
        procs = [tb.popen(r, [sys.executable, __file__, "rank", host, str(port), str(r), "4", str(iters),
                              code]) for r in range(4)]
        for p in procs:
            p.wait(timeout=600)
        sw.stop()


if __name__ == "__main__":
    if sys.argv[1] == "rank":
        rank_main(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7])
    else:
        driver(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
