# lazy helper's process counter (not part of the repo): one line per Python start/exit.
import os
import sys
import time
_T0 = time.time()
_LOG = os.environ.get("LZ_PROCLOG")
def _w(s):
    try:
        fd = os.open(_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, (s + "\n").encode())
        os.close(fd)
    except Exception:
        pass
if _LOG:
    _w("S %.3f %d %d %r" % (_T0, os.getpid(), os.getppid(), getattr(sys, "orig_argv", sys.argv)[:8]))
    import atexit
    def _bye():
        m = sys.modules
        kind = ",".join(k for k in ("netreduce.switch.daemon", "netreduce.api", "netreduce.worker.communicator",
                                    "torch", "tensorflow", "mxnet", "numpy", "pytest") if k in m)
        _w("E %.3f %d %.3f %s" % (time.time(), os.getpid(), time.time() - _T0, kind))
    atexit.register(_bye)
