"""The package's version, in a module of its own: the daemon reports it without
importing the package's public API (netreduce/__init__.py, which loads the worker)."""
__version__ = "0.1.0"
