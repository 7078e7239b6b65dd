"""The guess environment's FastAPI app: ``uvicorn guess_env.server.app:app --host 127.0.0.1 --port 8000``."""

from openenv.core.env_server.http_server import create_app

from guess_env.models import GuessAction, GuessObservation
from guess_env.server.guess_environment import GuessEnvironment

app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess_env", max_concurrent_envs=64)
