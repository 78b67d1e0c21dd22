# The cost D12's fold adds to a steady allreduce call: one more Python frame
# (allreduce -> _allreduce_now) with the same 7 arguments; the inner work stubbed.
import timeit, statistics
def _steady(a, op, name, pre, post, dtype, inplace): return a
def inner(array, op, name, pre, post, dtype, inplace):
    if name is not None:
        out = _steady(array, op, name, pre, post, dtype, inplace)
        if out is not None:
            return out
def folded(array, op=0, name=None, prescale_factor=1.0, postscale_factor=1.0, *, dtype=None):
    return inner(array, op, name, prescale_factor, postscale_factor, dtype, False)
def before(array, op=0, name=None, prescale_factor=1.0, postscale_factor=1.0, *, dtype=None):
    if name is not None:
        out = _steady(array, op, name, prescale_factor, postscale_factor, dtype, False)
        if out is not None:
            return out
a = object()
res = {"before": [], "folded": []}
for _ in range(5):
    for k, f in (("before", before), ("folded", folded)) if _ % 2 == 0 else (("folded", folded), ("before", before)):
        res[k].append(min(timeit.repeat(lambda: f(a, 0, "g"), number=200000, repeat=5)) / 200000 * 1e9)
for k, v in res.items():
    print(k, "ns/call median %.1f (%.1f-%.1f)" % (statistics.median(v), min(v), max(v)))
print("added ns: median of paired differences %.1f" % statistics.median([f - b for f, b in zip(res["folded"], res["before"])]))
