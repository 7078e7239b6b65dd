"""Environments: the protocol every rollout steps (:mod:`~trl_agentic.environments.base`: ``Environment``,
``StepResult``, ``StepInfo``), text tags turned into tool calls (:mod:`~trl_agentic.environments.tag_protocol`,
:mod:`~trl_agentic.environments.tag_environment`), native tool calls parsed by the chat template
(:mod:`~trl_agentic.environments.native_tools`), and TRL's ``tools=`` / ``environment_factory=`` as environments of
our engine (:mod:`~trl_agentic.environments.trl_environments`). The common names are exported by ``trl_agentic``."""
