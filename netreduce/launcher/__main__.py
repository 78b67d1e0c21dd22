"""python -m netreduce.launcher: netreduce-run."""
from netreduce.launcher.command import main

main()
