"""The two kinds of failure the CLI distinguishes (exit codes 2 and 1)."""


class UserError(Exception):
  """A usage or configuration error: one line on stderr, exit code 2."""


class RunFailure(Exception):
  """A runtime failure (non-finite loss, corrupt data or checkpoint): exit code 1."""
