#!/usr/bin/env python3
"""What one control message costs to encode and decode (issue 34: which library
carries the control protocol's schema).

    python3 benchmarks/control_codec.py --json benchmarks/results/control_codec.json

For each codec, the CPU time of one request/reply round as both ends spend it: the
rank encodes the request and decodes the reply, the daemon decodes the request and
encodes the reply (4 operations), and the bytes on the wire, for

* ``step``: a cached steady-state step through the coordinator (NETREDUCE_CACHE_AGREEMENT=0,
  or a cache miss's second step): ``negotiate`` with one cache id, its reply one log
  entry naming that id;
* ``first``: the first step of one tensor: the full tensor request, the entry with
  the id assigned;
* ``join``: what one rank's join sends and gets (hello + register + negotiate_hello):
  x 1,000 for a 1,000-rank job.

Codecs: ``json`` is the protocol before the schema (stdlib json, dicts with one-letter
keys: what netreduce/switch/loop.py and negotiation.py did); ``msgspec-json`` and
``msgspec-msgpack`` are netreduce/protocol/messages.py's typed structs (JSON is what
the wire carries); ``protobuf`` is the same messages in protobuf (upb), built from
descriptors at run time (no protoc), with a oneof per request as gRPC would carry them.
Each figure is the median of ``--repeat`` timeit runs of ``--number`` rounds; CPU
time (time.process_time), so other processes' load counts less than in wall time.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import msgspec  # noqa: E402

from netreduce.protocol.codec import Envelope, encode_reply, encode_request  # noqa: E402
from netreduce.protocol import messages as m  # noqa: E402


# --- the messages, in each codec ---------------------------------------------------
def old_json() -> Dict[str, Tuple[Callable[[], Any], ...]]:
    dumps = lambda o: (json.dumps(o, separators=(",", ":")) + "\n").encode()  # noqa: E731
    t = {"n": "grad.layer3.weight", "k": "allreduce", "d": "float32", "s": [1024, 256],
         "o": "sum"}
    msgs = {
        "step": ({"cmd": "negotiate", "id": 7, "reqs": [3], "ack": 41, "wait_ms": 1000.0,
                  "stall_s": 60.0},
                 {"ok": True, "id": 7, "e": [{"t": [3], "seq": 41}]}),
        "first": ({"cmd": "negotiate", "id": 1, "reqs": [t], "ack": 0, "wait_ms": 1000.0,
                   "stall_s": 60.0},
                  {"ok": True, "id": 1, "e": [{"t": [0], "a": {"grad.layer3.weight": 0},
                                              "seq": 0}]}),
    }
    join = [({"cmd": "register", "job": "train-42", "rank": 517, "size": 1000, "mtu": 1500,
              "ipv6": False, "host": "node-17", "await_payload": True, "deterministic": False,
              "window": 0, "receive_buffer": 212992, "receive_coalesced": True},
             {"ok": True, "job_index": 3, "key": 2864434397, "slots": 45,
              "payload_bytes": 0, "window_fit": 0, "payload_reason": "", "missing": list(range(16)),
              "missing_count": 483, "data_port": 4791, "threads": 1, "deterministic": False,
              "group": "", "group_port": 0, "group_optional": False}),
            ({"cmd": "negotiate_hello", "role": "all", "job": "train-42", "rank": 517,
              "size": 1000, "threshold": 67108864, "capacity": 1024, "timeout": 120.0,
              "agree": 1},
             {"ok": True, "size": 1000, "seq": 0, "agree": 1, "capacity": 1024,
              "threshold": 67108864})]
    out = {}
    for name, (req, rep) in msgs.items():
        out[name] = _round(lambda q=req: dumps(q), json.loads, lambda p=rep: dumps(p), json.loads)
    out["join"] = _rounds([(lambda q=q: dumps(q), json.loads, lambda p=p: dumps(p), json.loads)
                           for q, p in join])
    return out


def typed(encoding: str) -> Dict[str, Tuple[Callable[[], Any], ...]]:
    t = m.TensorRequest("grad.layer3.weight", "allreduce", "float32", [1024, 256], "sum")
    step_q = m.Negotiate(id=7, reqs=[3], ack=41, wait_ms=1000.0, stall_s=60.0)
    step_p = m.NegotiateReply(entries=[m.LogEntry(41, [3])])
    first_q = m.Negotiate(id=1, reqs=[t], ack=0, wait_ms=1000.0, stall_s=60.0)
    first_p = m.NegotiateReply(entries=[m.LogEntry(0, [0], assign={"grad.layer3.weight": 0})])
    join = [(m.Hello(version=m.PROTOCOL_VERSION, software="netreduce 0.1.0"),
             m.HelloReply(version=m.PROTOCOL_VERSION, software="netreduce-switch 0.1.0")),
            (m.Register(job="train-42", rank=517, size=1000, mtu=1500, host="node-17",
                        await_payload=True, window=0, receive_buffer=212992),
             m.RegisterReply(job_index=3, key=2864434397, slots=45, payload_bytes=0,
                             missing=list(range(16)), missing_count=483, data_port=4791)),
            (m.NegotiateHello(job="train-42", rank=517, size=1000, role="all",
                              threshold=67108864, capacity=1024, timeout=120.0, agree=True),
             m.NegotiateHelloReply(size=1000, seq=0, agree=True, capacity=1024,
                                   threshold=67108864))]
    if encoding == "json":
        enc = msgspec.json.Encoder()
        req_dec = msgspec.json.Decoder(m.AnyRequest)
        rep_dec = {k: msgspec.json.Decoder(k) for k in m.REPLY_OF.values()}
        env = msgspec.json.Decoder(Envelope)

        def rq(q: Any) -> Callable[[], bytes]:
            return lambda: encode_request(q)

        def rp(p: Any, rid: Any) -> Callable[[], bytes]:
            return lambda: encode_reply(p, rid)

        def dp(kind: Any) -> Callable[[bytes], Any]:
            d = rep_dec[kind]
            return lambda b: (env.decode(b), d.decode(b))  # envelope (routing), then typed
        out = {
            "step": _round(rq(step_q), req_dec.decode, rp(step_p, 7), dp(m.NegotiateReply)),
            "first": _round(rq(first_q), req_dec.decode, rp(first_p, 1), dp(m.NegotiateReply)),
        }
        out["join"] = _rounds([(rq(q), req_dec.decode, rp(p, None), dp(type(p))) for q, p in join])
        return out
    enc = msgspec.msgpack.Encoder()
    req_dec = msgspec.msgpack.Decoder(m.AnyRequest)
    out = {}
    for name, (q, p) in {"step": (step_q, step_p), "first": (first_q, first_p)}.items():
        d = msgspec.msgpack.Decoder(type(p))
        out[name] = _round(lambda q=q: enc.encode(q), req_dec.decode,
                           lambda p=p: enc.encode(p), d.decode)
    out["join"] = _rounds([(lambda q=q: enc.encode(q), req_dec.decode, lambda p=p: enc.encode(p),
                            msgspec.msgpack.Decoder(type(p)).decode) for q, p in join])
    return out


def protobuf() -> Dict[str, Tuple[Callable[[], Any], ...]]:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="nrbench.proto", package="nrbench",
                                             syntax="proto3")

    def msg(name: str, fields: List[Tuple[str, int, int, str]], oneof: str = "") -> None:
        d = fdp.message_type.add(name=name)
        if oneof:
            d.oneof_decl.add(name=oneof)
        for i, (fname, ftype, label, tname) in enumerate(fields, 1):
            f = d.field.add(name=fname, number=i, type=ftype, label=label)
            if tname:
                f.type_name = "." + tname if "." in tname else ".nrbench." + tname
            if oneof and fname not in ("id",) and ftype == F.TYPE_MESSAGE:
                f.oneof_index = 0
    O, R = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    msg("Tensor", [("name", F.TYPE_STRING, O, ""), ("kind", F.TYPE_STRING, O, ""),
                   ("dtype", F.TYPE_STRING, O, ""), ("shape", F.TYPE_INT64, R, ""),
                   ("op", F.TYPE_STRING, O, ""), ("prescale", F.TYPE_DOUBLE, O, ""),
                   ("postscale", F.TYPE_DOUBLE, O, ""), ("root", F.TYPE_INT32, O, ""),
                   ("uncacheable", F.TYPE_BOOL, O, "")])
    msg("Ref", [("cache_id", F.TYPE_INT64, O, ""), ("tensor", F.TYPE_MESSAGE, O, "Tensor")])
    msg("Negotiate", [("reqs", F.TYPE_MESSAGE, R, "Ref"), ("ack", F.TYPE_INT64, O, ""),
                      ("wait_ms", F.TYPE_DOUBLE, O, ""), ("stall_s", F.TYPE_DOUBLE, O, "")])
    msg("Register", [("job", F.TYPE_STRING, O, ""), ("rank", F.TYPE_INT32, O, ""),
                     ("size", F.TYPE_INT32, O, ""), ("mtu", F.TYPE_UINT32, O, ""),
                     ("ipv6", F.TYPE_BOOL, O, ""), ("host", F.TYPE_STRING, O, ""),
                     ("await_payload", F.TYPE_BOOL, O, ""), ("deterministic", F.TYPE_BOOL, O, ""),
                     ("window", F.TYPE_INT32, O, ""), ("receive_buffer", F.TYPE_UINT64, O, ""),
                     ("receive_coalesced", F.TYPE_BOOL, O, "")])
    msg("NegotiateHello", [("job", F.TYPE_STRING, O, ""), ("rank", F.TYPE_INT32, O, ""),
                           ("size", F.TYPE_INT32, O, ""), ("role", F.TYPE_STRING, O, ""),
                           ("threshold", F.TYPE_INT64, O, ""), ("capacity", F.TYPE_INT32, O, ""),
                           ("timeout", F.TYPE_DOUBLE, O, ""), ("agree", F.TYPE_BOOL, O, "")])
    msg("Hello", [("version", F.TYPE_INT32, O, ""), ("software", F.TYPE_STRING, O, "")])
    msg("Request", [("id", F.TYPE_INT64, O, ""), ("negotiate", F.TYPE_MESSAGE, O, "Negotiate"),
                    ("register", F.TYPE_MESSAGE, O, "Register"),
                    ("negotiate_hello", F.TYPE_MESSAGE, O, "NegotiateHello"),
                    ("hello", F.TYPE_MESSAGE, O, "Hello")], oneof="cmd")
    msg("Entry", [("seq", F.TYPE_INT64, O, ""), ("ids", F.TYPE_INT64, R, ""),
                  ("names", F.TYPE_STRING, R, ""), ("assign_names", F.TYPE_STRING, R, ""),
                  ("assign_ids", F.TYPE_INT64, R, "")])
    msg("NegotiateReply", [("entries", F.TYPE_MESSAGE, R, "Entry")])
    msg("RegisterReply", [("job_index", F.TYPE_INT32, O, ""), ("key", F.TYPE_UINT32, O, ""),
                          ("slots", F.TYPE_INT32, O, ""), ("payload_bytes", F.TYPE_INT32, O, ""),
                          ("window_fit", F.TYPE_INT32, O, ""),
                          ("payload_reason", F.TYPE_STRING, O, ""),
                          ("missing", F.TYPE_INT32, R, ""), ("missing_count", F.TYPE_INT32, O, ""),
                          ("data_port", F.TYPE_INT32, O, ""), ("threads", F.TYPE_INT32, O, ""),
                          ("deterministic", F.TYPE_BOOL, O, ""), ("group", F.TYPE_STRING, O, ""),
                          ("group_port", F.TYPE_INT32, O, ""),
                          ("group_optional", F.TYPE_BOOL, O, "")])
    msg("HelloReply", [("size", F.TYPE_INT32, O, ""), ("seq", F.TYPE_INT64, O, ""),
                       ("agree", F.TYPE_BOOL, O, ""), ("capacity", F.TYPE_INT32, O, ""),
                       ("threshold", F.TYPE_INT64, O, ""), ("version", F.TYPE_INT32, O, ""),
                       ("software", F.TYPE_STRING, O, "")])
    msg("Reply", [("id", F.TYPE_INT64, O, ""), ("ok", F.TYPE_BOOL, O, ""),
                  ("error", F.TYPE_STRING, O, ""),
                  ("negotiate", F.TYPE_MESSAGE, O, "NegotiateReply"),
                  ("register", F.TYPE_MESSAGE, O, "RegisterReply"),
                  ("hello", F.TYPE_MESSAGE, O, "HelloReply")], oneof="body")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    cls = {n: message_factory.GetMessageClass(pool.FindMessageTypeByName("nrbench." + n))
           for n in ("Request", "Reply", "Tensor")}
    Req, Rep = cls["Request"], cls["Reply"]

    def step_q() -> bytes:
        r = Req(id=7)
        n = r.negotiate
        n.reqs.add(cache_id=3)
        n.ack, n.wait_ms, n.stall_s = 41, 1000.0, 60.0
        return r.SerializeToString()

    def step_p() -> bytes:
        r = Rep(id=7, ok=True)
        r.negotiate.entries.add(seq=41, ids=[3])
        return r.SerializeToString()

    def first_q() -> bytes:
        r = Req(id=1)
        n = r.negotiate
        ref = n.reqs.add()
        t = ref.tensor
        t.name, t.kind, t.dtype, t.op = "grad.layer3.weight", "allreduce", "float32", "sum"
        t.shape.extend([1024, 256])
        t.prescale = t.postscale = 1.0
        t.root = -1
        n.ack, n.wait_ms, n.stall_s = 0, 1000.0, 60.0
        return r.SerializeToString()

    def first_p() -> bytes:
        r = Rep(id=1, ok=True)
        r.negotiate.entries.add(seq=0, ids=[0], assign_names=["grad.layer3.weight"],
                                assign_ids=[0])
        return r.SerializeToString()

    def join_msgs() -> List[Tuple[Callable[[], bytes], Callable[[], bytes]]]:
        def hello_q() -> bytes:
            r = Req()
            r.hello.version, r.hello.software = 2, "netreduce 0.1.0"
            return r.SerializeToString()

        def hello_p() -> bytes:
            r = Rep(ok=True)
            r.hello.version, r.hello.software = 2, "netreduce-switch 0.1.0"
            return r.SerializeToString()

        def reg_q() -> bytes:
            r = Req()
            g = r.register
            g.job, g.rank, g.size, g.mtu, g.host = "train-42", 517, 1000, 1500, "node-17"
            g.await_payload, g.window, g.receive_buffer, g.receive_coalesced = True, 0, 212992, True
            return r.SerializeToString()

        def reg_p() -> bytes:
            r = Rep(ok=True)
            g = r.register
            g.job_index, g.key, g.slots, g.payload_bytes = 3, 2864434397, 45, 0
            g.missing.extend(range(16))
            g.missing_count, g.data_port, g.threads = 483, 4791, 1
            return r.SerializeToString()

        def nh_q() -> bytes:
            r = Req()
            h = r.negotiate_hello
            h.job, h.rank, h.size, h.role = "train-42", 517, 1000, "all"
            h.threshold, h.capacity, h.timeout, h.agree = 67108864, 1024, 120.0, True
            return r.SerializeToString()

        def nh_p() -> bytes:
            r = Rep(ok=True)
            h = r.hello
            h.size, h.seq, h.agree, h.capacity, h.threshold = 1000, 0, True, 1024, 67108864
            return r.SerializeToString()
        return [(hello_q, hello_p), (reg_q, reg_p), (nh_q, nh_p)]

    out = {"step": _round(step_q, Req.FromString, step_p, Rep.FromString),
           "first": _round(first_q, Req.FromString, first_p, Rep.FromString),
           "join": _rounds([(q, Req.FromString, p, Rep.FromString) for q, p in join_msgs()])}
    return out


# --- timing -------------------------------------------------------------------------
def _round(enc_q: Callable[[], bytes], dec_q: Callable[[bytes], Any], enc_p: Callable[[], bytes],
           dec_p: Callable[[bytes], Any]) -> Tuple[Callable[[], None], int]:
    """One request/reply round as both ends spend it (building each message from its
    values counts: that is what a sender does), and its bytes."""
    q, p = enc_q(), enc_p()
    dec_q(q)
    dec_p(p)

    def run() -> None:
        dec_q(enc_q())
        dec_p(enc_p())
    return run, len(q) + len(p)


def _rounds(parts: List[Tuple[Callable[[], bytes], ...]]) -> Tuple[Callable[[], None], int]:
    made = [_round(*p) for p in parts]

    def run() -> None:
        for fn, _ in made:
            fn()
    return run, sum(b for _, b in made)


def measure(fn: Callable[[], None], number: int, repeat: int) -> List[float]:
    out = []
    for _ in range(repeat):
        t = time.process_time()
        for _ in range(number):
            fn()
        out.append((time.process_time() - t) / number * 1e6)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--number", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    codecs = {"json": old_json(), "msgspec-json": typed("json"),
              "msgspec-msgpack": typed("msgpack")}
    try:
        codecs["protobuf"] = protobuf()
    except ImportError as exc:
        print(f"protobuf left out: {exc}", file=sys.stderr)
    load0 = os.getloadavg()[0]
    rows: Dict[str, Dict[str, Any]] = {}
    for codec, cases in codecs.items():
        for case, (fn, nbytes) in cases.items():
            runs = measure(fn, args.number if case != "join" else args.number // 3, args.repeat)
            rows.setdefault(codec, {})[case] = {
                "us_median": round(statistics.median(runs), 3), "us_min": round(min(runs), 3),
                "us_max": round(max(runs), 3), "bytes": nbytes}
    rec = {"command": "python3 benchmarks/control_codec.py " + " ".join(sys.argv[1:]),
           "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "load": [round(load0, 2), round(os.getloadavg()[0], 2)],
           "python": sys.version.split()[0], "msgspec": msgspec.__version__, "rows": rows}
    try:
        import google.protobuf
        from google.protobuf.internal import api_implementation
        rec["protobuf"] = f"{google.protobuf.__version__} ({api_implementation.Type()})"
    except ImportError:
        pass
    print(f"{'codec':16} {'case':6} {'us/round (min-max)':>26} {'bytes':>6}")
    for codec, cases in rows.items():
        for case, r in cases.items():
            print(f"{codec:16} {case:6} {r['us_median']:>9.2f} ({r['us_min']:.2f}-{r['us_max']:.2f})"
                  f"{'':>4} {r['bytes']:>6}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rec, f, indent=1)


if __name__ == "__main__":
    main()
