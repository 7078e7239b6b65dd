"""The kinds of rollout the library runs (our environments, TRL's ``tools=`` / ``environment_factory=``, agents of
any framework): chosen once from a trainer's or ``evaluate``'s arguments (:mod:`~trl_agentic.kinds.choice`), their
arguments checked before anything is built (:mod:`~trl_agentic.kinds.checks`). Above ``rollout/``, ``agents/``,
``environments/`` and ``rewards/``, which it composes; below ``trainers/`` and ``evaluate/``, which use it."""
