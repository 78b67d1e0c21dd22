"""horovod.runner.util.threads.in_thread, which Horovod's test/utils/common.py imports
to run a delayed call (test plumbing, not API under test)."""
import threading


def in_thread(target, args=(), name=None, daemon=True, silent=False):
    """Start ``target(*args)`` in a thread and return the thread."""
    def run():
        try:
            target(*args)
        except BaseException:
            if not silent:
                raise
    thread = threading.Thread(target=run, name=name, daemon=daemon)
    thread.start()
    return thread
