"""adder_env: add two numbers with an ``add`` tool and ``submit`` the sum. An OpenEnv MCP tool environment laid out
as ``openenv init`` scaffolds one: the environment and its FastAPI app (``server/``), and an MCP tool client."""

from adder_env.client import AdderEnv

__all__ = ["AdderEnv"]
