"""The cost dup's fold adds to a steady allreduce call: one more Python frame
(allreduce -> _allreduce_now) with the same 7 arguments; the inner work stubbed.
Run as recorded in BENCHMARKS.md (dup, 12-07): python3 dup_frame.py"""
import statistics
import timeit


def _steady(a, op, name, pre, post, dtype, inplace):
    return a


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
for i in range(5):
    order = (("before", before), ("folded", folded))
    for k, f in order if i % 2 == 0 else order[::-1]:
        best = min(timeit.repeat(lambda f=f: f(a, 0, "g"), number=200000, repeat=5))
        res[k].append(best / 200000 * 1e9)
for k, v in res.items():
    print(k, "ns/call median %.1f (%.1f-%.1f)" % (statistics.median(v), min(v), max(v)))
diffs = [f - b for f, b in zip(res["folded"], res["before"])]
print("added ns: median of paired differences %.1f" % statistics.median(diffs))
