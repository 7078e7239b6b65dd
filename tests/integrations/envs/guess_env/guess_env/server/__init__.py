"""The guess environment's server components."""

from guess_env.server.guess_environment import GuessEnvironment

__all__ = ["GuessEnvironment"]
