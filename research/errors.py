"""The one exception type for mistakes a user can fix (main prints it as `error: ...`), and the
exit codes of the commands."""

EXIT_USER_ERROR = 2  # bad input: one `error:` line, nothing written
EXIT_INTERRUPTED = 130  # the shell's code for a run stopped by Ctrl-C (128 + SIGINT)


class UserError(Exception):
  """Bad input (config, data, flags): the message says what was wrong and what to do."""
