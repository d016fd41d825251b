"""A test agent that hangs, with a child process of its own: both must be killed by the runner.
Writes "<own pid> <child pid>" to $HANG_PIDS_FILE once the child runs, then waits forever."""

from __future__ import annotations

import os
import subprocess
import sys
import time

child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
path = os.environ["HANG_PIDS_FILE"]
with open(path + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
os.replace(path + ".tmp", path)  # the test never reads a half-written file
while True:
    time.sleep(60)
