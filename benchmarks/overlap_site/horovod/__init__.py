"""Stands in for the horovod package when benchmarks/overlap_site is first on
PYTHONPATH (benchmarks/overlap_step.py): only ``horovod.torch`` is answered, by
``horovod/torch/__init__.py``."""
