"""netreduce-run, the launcher: a job's ranks on this host or across hosts, with
horovodrun's flags, and an aggregator unless one is given (command.py: the command
line, the aggregator, the ranks' environment; hosts.py: host lists and placement;
spawn.py: one rank started locally or over ssh; host_connection.py: one ssh
connection per remote host, remote.py its keeper there, which forks the host's ranks;
output.py: their prefixed lines; forking.py: the one thread that forks; job.py:
supervising and stopping them; elastic/: elastic jobs)."""
from netreduce.launcher.command import main  # noqa: F401  (netreduce-run's console script)
