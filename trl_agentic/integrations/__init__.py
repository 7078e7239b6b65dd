"""The environments users already have, trained unchanged (``docs/environments.md``). One module per ecosystem, each
importing its package only when used, so that ``import trl_agentic`` never needs them:

- :mod:`~trl_agentic.integrations.verifiers`: a verifiers v1 ``Env`` (the Environments Hub's library) as a dataset,
  an agent run against the OpenAI-compatible endpoint and a reward function, the one seat the policy plays trained
  and the others (``user-sim``'s user) played by their players through
  :mod:`~trl_agentic.integrations.seat_server` (``pip install 'trl-agentic[verifiers]'``);
- :mod:`~trl_agentic.integrations.openenv`: OpenEnv environment servers on 127.0.0.1, started, health-checked,
  restarted and stopped by the run, for TRL's ``environment_factory`` classes around their clients, and the base of
  such a class that gives each turn the environment's reward and state (``pip install 'trl-agentic[openenv]'``); MCP
  tool environments as an ``environment=`` whose tools are the ones their server lists
  (:mod:`~trl_agentic.integrations.openenv_mcp`);
- :mod:`~trl_agentic.integrations.textarena`: a TextArena game as an :class:`~trl_agentic.Environment`, its own
  reward as the turn reward and its state as each turn's state key; a game of several players as the seats of a
  :class:`~trl_agentic.rollout.seats.Seats` (``pip install 'trl-agentic[textarena]'``);
- :mod:`~trl_agentic.integrations.state_keys`: the key GiGPO groups turns by, for a state reported as data.
"""
