"""The one place that reads NETREDUCE_* environment variables.

Each knob is declared once: name, type, default, one line of help. ``netreduce
info`` prints them all with their current values and where each came from.
Nothing else in netreduce reads the environment."""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Dict, Optional


@dataclasses.dataclass(frozen=True)
class Knob:
    name: str
    type: Callable[[str], Any]
    default: Any
    help: str


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected a boolean (1/0, true/false), got {text!r}")


KNOBS: Dict[str, Knob] = {}


def declare(name: str, type: Callable[[str], Any], default: Any, help: str) -> Knob:
    knob = Knob(name, type, default, help)
    if name in KNOBS:
        raise RuntimeError(f"knob {name} declared twice")
    KNOBS[name] = knob
    return knob


# --- data plane -------------------------------------------------------------
declare("NETREDUCE_SWITCH", str, "",
        "aggregator control address host:port; empty = the launcher's embedded one")
declare("NETREDUCE_TIMEOUT", float, 30.0,
        "seconds an operation may wait (aggregator silence, missing ranks) before failing")
declare("NETREDUCE_RETRANSMIT_MS", float, 20.0,
        "first per-slot retransmission timeout in ms; doubles on each retry (capped at 1 s)")
declare("NETREDUCE_DROP_RATE", float, 0.0,
        "fraction [0,1) of outgoing data packets the engine drops on purpose (loss tests)")
declare("NETREDUCE_WINDOW", int, 0,
        "slots a worker keeps outstanding; 0 = all the slots the aggregator grants")


def get(name: str) -> Any:
    """Current value of knob ``name``: the environment if set, else its default."""
    knob = KNOBS[name]
    raw = os.environ.get(name)
    if raw is None:
        return knob.default
    try:
        return knob.type(raw)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}={raw!r} is not a valid {knob.type.__name__}: {exc}") from None


def source(name: str) -> str:
    return "environment" if name in os.environ else "default"


def snapshot(overrides: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    values = {name: get(name) for name in KNOBS}
    values.update(overrides or {})
    return values
