"""Agentic SFT: demonstrations and successful rollouts as supervised data, in the rollout engine's own token layout.

One job per module:

- :mod:`~trl_agentic.sft.demonstrations`: a demonstration (TRL's prompt-completion row) replayed through the rollout
  engine into a :class:`~trl_agentic.Trajectory` (:func:`transcript_to_trajectory`,
  :func:`demonstration_to_trajectory`, :class:`DemonstrationError`);
- :mod:`~trl_agentic.sft.dataset`: trajectories as pre-tokenized ``SFTTrainer`` rows whose labels leave prompt and
  observation tokens out (:func:`trajectory_to_sft_example`, :func:`sft_dataset`);
- :mod:`~trl_agentic.sft.rejection`: the model's own trajectories that a verifier accepts (:func:`rejection_sampling`).

The RFT loop (rounds of rejection sampling, then ``SFTTrainer``) is the recipe ``recipes/rft.py``. See ``docs/sft.md``.
"""

from .dataset import sft_dataset, trajectory_to_sft_example
from .demonstrations import DemonstrationError, demonstration_to_trajectory, transcript_to_trajectory
from .rejection import RejectionSample, rejection_sampling

__all__ = [
    "DemonstrationError",
    "RejectionSample",
    "demonstration_to_trajectory",
    "rejection_sampling",
    "sft_dataset",
    "trajectory_to_sft_example",
    "transcript_to_trajectory",
]
