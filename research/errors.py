"""The one exception type for mistakes a user can fix; main prints it as `error: ...`."""


class UserError(Exception):
  """Bad input (config, data, flags): the message says what was wrong and what to do."""
