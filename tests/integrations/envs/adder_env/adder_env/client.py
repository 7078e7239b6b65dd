"""The adder environment's client: OpenEnv's MCP tool client, as echo_env's."""

from openenv.core.mcp_client import MCPToolClient


class AdderEnv(MCPToolClient):
    """Client of the adder environment: ``list_tools()``, ``call_tool(name, **arguments)``, ``reset``, ``step``."""
