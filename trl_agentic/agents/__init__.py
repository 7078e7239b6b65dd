"""Train an agent written in any framework: an OpenAI-compatible endpoint in front of the policy, token-exact.

``AgenticGRPOTrainer(..., agent=agent)`` / ``AgenticPPOTrainer(..., agent=agent)`` / ``evaluate(..., agent=agent)``
run ``agent(client, **row)`` once per dataset row; the agent talks to the policy through the client (the OpenAI SDK,
or any framework given its base URL and key), and every model call is recorded token for token. Modules, one job each:

- :mod:`~trl_agentic.agents.protocol`: OpenAI's chat-completions shapes, server-sent events, error bodies;
- :mod:`~trl_agentic.agents.responses`, :mod:`~trl_agentic.agents.completions`, :mod:`~trl_agentic.agents.messages`:
  the Responses API, legacy completions and Anthropic's Messages API, read into the same requests;
- :mod:`~trl_agentic.agents.forcing`: ``tool_choice="required"`` and a named function (the opening of a call);
- :mod:`~trl_agentic.agents.prompt`: a conversation's ids, every string in it untrusted text;
- :mod:`~trl_agentic.agents.session`: one trajectory's record, prefix reuse and segments, budgets;
- :mod:`~trl_agentic.agents.bridge`: concurrent model calls batched into one ``Generator.generate`` call;
- :mod:`~trl_agentic.agents.server`: the FastAPI app on 127.0.0.1, per-trajectory keys;
- :mod:`~trl_agentic.agents.ownership`: which agent sent a request; trajectories that mixed fail;
- :mod:`~trl_agentic.agents.runner`: the rollout (agents, timeouts, trajectories);
- :mod:`~trl_agentic.agents.seam`: the agents behind the rollout seam the trainers and ``evaluate`` call
  (:mod:`~trl_agentic.rollout.seam`; a run's training rows are its segments, one row each);
- :mod:`~trl_agentic.agents.agent_loop`: the agents' event loop, watched for blocking agents;
- :mod:`~trl_agentic.agents.metrics`: what an agent round logs, from counts over its runs.
"""

from .protocol import Limits
from .runner import Agent, AgentEndpoint, AgentRollout
from .session import AgentTrajectory

__all__ = ["Agent", "AgentEndpoint", "AgentRollout", "AgentTrajectory", "Limits"]
