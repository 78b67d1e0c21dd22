"""The aggregator's control plane: job admission, counters, negotiation (TCP, JSON lines)."""
