"""Several launches of research.main (or research.trained) in one child process on N CPU
devices: a test that needs runs on another device count than the suite's 8 pays one Python
start and one JAX import for all of them, and its launches share the child's caches."""

import json
import subprocess
import sys
from pathlib import Path

from research import environment

# argv[1]: a JSON list of [module, its argv, the file its stdout and stderr go to]; each is run
# in turn as its command line would run it, the exit codes printed as one JSON list.
CHILD = """
import contextlib, json, sys
from research import main, trained

codes = []
for module, argv, out in json.loads(sys.argv[1]):
  with open(out, "w") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
    try:
      if module == "research.main":
        sys.argv = ["research.main", *argv]
        codes.append(main.main())
      else:
        codes.append(trained.main(argv))
    except SystemExit as e:  # argparse's usage error, an interrupted run: its code, as a shell's
      codes.append(e.code if isinstance(e.code, int) else 1)
print(json.dumps(codes))
"""


def run(devices: int, launches: list, directory: Path, path=None, timeout: int = 600) -> list:
  """[(exit code, its output)] of `launches` [(module, argv)] ("research.main" or
  "research.trained"), run in turn in one child on `devices` CPU devices (the suite's XLA
  flags); `path`: a directory put first on its PYTHONPATH (a fork's modules)."""
  env = environment.for_devices(devices, "cpu")
  if path:
    env["PYTHONPATH"] = str(path)
  outs = [Path(directory) / f"launch-{i}.log" for i in range(len(launches))]
  jobs = [
    [module, list(argv), str(out)] for (module, argv), out in zip(launches, outs, strict=True)
  ]
  command = [sys.executable, "-c", CHILD, json.dumps(jobs)]
  child = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
  logs = "".join(f"--- {out}:\n{out.read_text()[-1500:]}" for out in outs if out.exists())
  assert child.returncode == 0, child.stdout[-2000:] + child.stderr[-2000:] + logs
  codes = json.loads(child.stdout.strip().splitlines()[-1])
  return [(code, out.read_text()) for code, out in zip(codes, outs, strict=True)]
