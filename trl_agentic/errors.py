"""The error of a setting the user must change (standard library only: any module may raise it)."""


class TaskConfigError(ValueError):
    """A setting the user must change: the message is one sentence naming the option and what to pass instead.
    Command-line entry points print it without a traceback and exit with status 2."""
