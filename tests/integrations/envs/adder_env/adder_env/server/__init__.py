"""The adder environment's server components."""

from adder_env.server.adder_environment import AdderEnvironment

__all__ = ["AdderEnvironment"]
