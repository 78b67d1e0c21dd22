"""The data plane's dtypes by name, without numpy: which dtype each element type
travels in and how many bytes an element takes there. netreduce/ops.py builds numpy's
dtypes from these tables for the worker; the negotiation signatures
(netreduce/protocol/signature.py) need only the names and sizes, so the aggregator
daemon, which holds no array, starts without importing numpy (~0.1 s of its start)."""

# dtype name -> the dtype the data plane carries it in. The native engine handles the
# wire types as they are (native/reduce/dtype.h); small integer types ride in a wider
# exact integer type so that a sum of up to 2**24 ranks cannot overflow on the wire
# (the result is cast back, wrapping like numpy does).
WIRE_DTYPE = {
    "float32": "float32", "float64": "float64", "float16": "float16",
    "bfloat16": "bfloat16", "int32": "int32", "int64": "int64",
    "int8": "int32", "uint8": "int32", "int16": "int32", "uint16": "int32",
    "uint32": "int64",
}

# Bytes per element of each wire dtype (bfloat16 travels as its 16-bit pattern);
# ops.STORAGE's numpy dtypes have these itemsizes (tests/unit/test_ops.py checks it).
WIRE_ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int32": 4,
                 "int64": 8}

# What the data plane carries as it is (the aggregator's slot types).
NATIVE_DTYPES = tuple(name for name, wire in WIRE_DTYPE.items() if name == wire)
