"""python -m netreduce.switch: the netreduce-switch daemon (what spawn() runs)."""
import sys

from netreduce.switch.daemon import main

sys.exit(main())
