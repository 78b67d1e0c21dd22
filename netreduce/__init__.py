"""netreduce: in-network aggregation all-reduce for distributed DNN training."""
__version__ = "0.1.0"

from netreduce.errors import NetReduceError  # noqa: F401
