"""The adder environment: the reset's seed draws two numbers from 1 to 50 and asks for their sum; the tools are
``add`` and ``submit``. Submitting ends the episode, with reward 1 for the right sum."""

import random
from typing import Any, Optional
from uuid import uuid4

from fastmcp import FastMCP
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.env_server.types import Action, Observation, State


class AdderEnvironment(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        mcp = FastMCP("adder_env")

        @mcp.tool
        def add(a: int, b: int) -> int:
            """
            Add two integers.

            Args:
                a: The first integer
                b: The second integer

            Returns:
                Their sum
            """
            return a + b

        @mcp.tool
        def submit(answer: int) -> str:
            """
            Submit the final answer, which ends the episode.

            Args:
                answer: The sum asked for

            Returns:
                Whether it is right
            """
            return "Right!" if answer == sum(self._numbers) else "Wrong."

        super().__init__(mcp)
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self._numbers = (0, 0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> Observation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        rng = random.Random(seed)
        self._numbers = (rng.randint(1, 50), rng.randint(1, 50))
        a, b = self._numbers
        return Observation(done=False, reward=0.0, metadata={"question": f"What is {a} plus {b}?"})

    def _step_impl(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        return Observation(done=False, reward=0.0, metadata={"error": f"Unknown action type: {type(action).__name__}"})

    def _scored(self, action: Action, observation: Observation) -> Observation:
        """A submission ends the episode, with reward 1 for the right sum."""
        if isinstance(action, CallToolAction) and action.tool_name == "submit":
            observation.done = True
            observation.reward = float(action.arguments.get("answer") == sum(self._numbers))
        return observation

    def step(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        self._state.step_count += 1
        return self._scored(action, super().step(action, timeout_s=timeout_s, **kwargs))

    async def step_async(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        self._state.step_count += 1
        return self._scored(action, await super().step_async(action, timeout_s=timeout_s, **kwargs))

    @property
    def state(self) -> State:
        return self._state
