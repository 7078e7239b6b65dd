"""guess_env: guess a number from 1 to 8, told higher or lower. An OpenEnv environment laid out as ``openenv init``
scaffolds one: typed models, the environment and its FastAPI app (``server/``), and a WebSocket client."""

from guess_env.client import GuessEnv
from guess_env.models import GuessAction, GuessObservation

__all__ = ["GuessAction", "GuessEnv", "GuessObservation"]
