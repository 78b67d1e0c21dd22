"""netreduce-run, the launcher: N ranks of one command on this host, with an
aggregator unless one is given (command.py: the command line, the aggregator, the
ranks' environment and the supervision loop; ranks.py: starting, prefixing and
stopping the rank processes)."""
from netreduce.launcher.command import main  # noqa: F401  (netreduce-run's console script)
