"""The guess environment's client (a persistent WebSocket session per client)."""

from typing import Dict

from openenv.core import EnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server.types import State

from guess_env.models import GuessAction, GuessObservation


class GuessEnv(EnvClient[GuessAction, GuessObservation, State]):
    """Client of the guess environment: ``GuessEnv(base_url="http://localhost:8000").sync()``."""

    def _step_payload(self, action: GuessAction) -> Dict:
        return {"number": action.number}

    def _parse_result(self, payload: Dict) -> StepResult[GuessObservation]:
        obs = payload.get("observation", {})
        observation = GuessObservation(message=obs.get("message", ""), done=payload.get("done", False),
                                       reward=payload.get("reward"), metadata=obs.get("metadata", {}))
        return StepResult(observation=observation, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: Dict) -> State:
        return State(episode_id=payload.get("episode_id"), step_count=payload.get("step_count", 0))
