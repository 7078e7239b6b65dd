"""Data models of the guess environment."""

from openenv.core.env_server.types import Action, Observation
from pydantic import Field


class GuessAction(Action):
    """A guess."""

    number: int = Field(..., description="The number guessed")


class GuessObservation(Observation):
    """What the game says: the task at reset, then whether the number is higher or lower."""

    message: str = Field(default="", description="The game's message")
