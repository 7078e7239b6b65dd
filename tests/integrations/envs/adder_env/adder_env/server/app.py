"""The adder environment's FastAPI app: ``uvicorn adder_env.server.app:app --host 127.0.0.1 --port 8000``."""

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

from adder_env.server.adder_environment import AdderEnvironment

app = create_app(AdderEnvironment, CallToolAction, CallToolObservation, env_name="adder_env", max_concurrent_envs=64)
