"""Self-play on a TextArena game of two players (SPIRAL's setting, arXiv 2506.24119: TicTacToe, Kuhn Poker, Simple
Negotiation), end to end: both seats played and trained by the policy (``--opponent self``), or seat "Player 0"
trained against a frozen copy of the starting policy (``--opponent frozen``), on the game's own zero-sum reward;
each seat's run compared with the runs of its seat (``seat_baseline``: ``group``, or SPIRAL's ``rae``). Held-out
games (seeds from 1,000,000) are played before and after training by the policy as "Player 0" against the starting
model (``ModelPlayer``): its mean game reward there is the summary (``docs/environments.md``). Needs
``pip install 'trl-agentic[textarena]'``.

Settings come from a YAML config and TRL's flags (flags override the YAML); ``--help`` lists them::

    python recipes/textarena_selfplay.py --config recipes/configs/textarena_selfplay_grpo.yaml
    python recipes/textarena_selfplay.py --config recipes/configs/textarena_selfplay_grpo.yaml --game_id KuhnPoker-v0 \\
        --opponent frozen --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct

Offline, a tiny random model for a first look (``python -c "from trl_agentic.toy import save_tiny_model;
save_tiny_model('tiny-qwen2')"``)::

    python recipes/textarena_selfplay.py --config recipes/configs/textarena_selfplay_grpo.yaml \\
        --model_name_or_path tiny-qwen2 --max_steps 2 --eval_games 2 --output_dir outputs/selfplay-tiny
"""

from dataclasses import dataclass, field

from trl_agentic.evaluate.training import train_between_evaluations
from trl_agentic.integrations.textarena import game_reward, textarena_dataset, textarena_environment
from trl_agentic.rollout.players import FrozenCopy, ModelPlayer
from trl_agentic.scripts import AgenticScriptArguments, load_tokenizer, run, trainer_class

HELD_OUT_SEED = 1_000_000
OPPONENTS = ("self", "frozen")


@dataclass
class SelfPlayScriptArguments(AgenticScriptArguments):
    """TRL's ``ScriptArguments`` and ``algo``, and the game: its id, who plays "Player 1", how many games to train and
    evaluate on."""

    game_id: str = field(default="TicTacToe-v0", metadata={"help": "A TextArena game of two players."})
    opponent: str = field(default="self", metadata={
        "help": "self: both seats played and trained by the policy; frozen: Player 1 a frozen copy of the starting "
                "policy, Player 0 trained.", "choices": list(OPPONENTS)})
    num_games: int = field(default=512, metadata={"help": "Training rows: game seeds 0 .. num_games - 1."})
    eval_games: int = field(default=64, metadata={"help": "Held-out games against the starting model, before and "
                                                          "after training (0: none)."})
    prompt: str = field(default="", metadata={"help": "Text before each seat's opening in its prompt."})


def main(script_args, training_args, model_args) -> None:
    processing_class = load_tokenizer(model_args.model_name_or_path, revision=model_args.model_revision)
    opponent = "policy" if script_args.opponent == "self" else FrozenCopy()
    environment = textarena_environment(script_args.game_id, players={"Player 0": "policy", "Player 1": opponent})
    train = textarena_dataset(script_args.num_games, prompt=script_args.prompt)
    held_out = list(textarena_dataset(script_args.eval_games, seed=HELD_OUT_SEED, prompt=script_args.prompt))
    trainer = trainer_class(script_args.algo)(model=model_args.model_name_or_path, processing_class=processing_class,
                                              environment=environment, reward_funcs=game_reward(),
                                              train_dataset=train, args=training_args)
    start = ModelPlayer(model_args.model_name_or_path, device=str(trainer.accelerator.device))
    rival = textarena_environment(script_args.game_id, players={"Player 0": "policy", "Player 1": start})

    train_between_evaluations(trainer, held_out, game_reward(), {"environment": rival},
                              {"mean_reward": "reward", "accuracy": "wins"},
                              {"game_id": script_args.game_id, "opponent": script_args.opponent},
                              label="Player 0 against the starting model: ")

if __name__ == "__main__":
    raise SystemExit(run(main, SelfPlayScriptArguments, prog="python recipes/textarena_selfplay.py"))
