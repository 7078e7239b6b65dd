"""The guess environment: a number from 1 to 8 drawn from the reset's seed; each guess is answered higher or
lower; reward 1 for the right number, which ends the episode."""

import random
from typing import Any, Optional
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import State

from guess_env.models import GuessAction, GuessObservation


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS: bool = True

    def __init__(self):
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self._target = 1

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> GuessObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self._target = random.Random(seed).randint(1, 8)
        return GuessObservation(message="Guess my number from 1 to 8.", done=False, reward=0.0)

    def step(self, action: GuessAction) -> GuessObservation:  # type: ignore[override]
        self._state.step_count += 1
        if action.number == self._target:
            return GuessObservation(message="Right!", done=True, reward=1.0)
        hint = "higher" if action.number < self._target else "lower"
        return GuessObservation(message=f"No, {hint}.", done=False, reward=0.0)

    @property
    def state(self) -> State:
        return self._state
