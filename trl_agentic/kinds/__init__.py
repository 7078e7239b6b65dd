"""The kinds of rollout the library runs (our environments, TRL's ``tools=`` / ``environment_factory=``, agents of
any framework): chosen once from a trainer's or another entry point's arguments (:mod:`~trl_agentic.kinds.choice`;
``evaluate``, ``run_rollouts``, the SFT helpers and the command lines through :mod:`~trl_agentic.kinds.entry`), a
value given under another kind's name refused (:mod:`~trl_agentic.kinds.wrong_kind`), their arguments checked
before anything is built (:mod:`~trl_agentic.kinds.checks`). Above ``rollout/``, ``agents/``, ``environments/`` and
``rewards/``, which it composes; below ``trainers/``, ``evaluate/`` and ``sft/``, which use it."""
