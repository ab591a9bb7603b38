"""The one exception type for mistakes a user can fix (main prints it as `error: ...`), the
exit codes of the commands, and how a command ends on Ctrl-C."""

import os
import sys
from typing import NoReturn

EXIT_USER_ERROR = 2  # bad input: one `error:` line, nothing written
EXIT_INTERRUPTED = 130  # the shell's code for a run stopped by Ctrl-C (128 + SIGINT)


class UserError(Exception):
  """Bad input (config, data, flags): the message says what was wrong and what to do."""


def exit_interrupted(message: str) -> NoReturn:
  """Ends this process at once after `message` (one line on stderr) with EXIT_INTERRUPTED.
  Not a normal exit: the interrupt may have cut JAX off mid-work (a trace, a transfer, a
  compile), and tearing the interpreter down under its threads can crash (SIGSEGV)."""
  print(message, file=sys.stderr)
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(EXIT_INTERRUPTED)
