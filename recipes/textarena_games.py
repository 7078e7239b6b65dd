"""A single-player TextArena game, end to end: RL (GRPO, or PPO) on the game's own reward, evaluated on held-out
games before and after (``docs/environments.md``). Needs ``pip install 'trl-agentic[textarena]'``.

The game is ``trl_agentic.integrations.textarena`` (one game per trajectory, reset with the row's seed; the game's
reward when it ends); the rows are game seeds: ``num_games`` for training from seed 0, ``eval_games`` held out from
seed 1,000,000. Settings come from a YAML config and TRL's flags (flags override the YAML); ``--help`` lists them::

    python recipes/textarena_games.py --config recipes/configs/textarena_games_grpo.yaml
    python recipes/textarena_games.py --config recipes/configs/textarena_games_grpo.yaml --game_id Mastermind-v0 \\
        --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct --algo ppo

Offline, a tiny random model for a first look (``python -c "from trl_agentic.toy import save_tiny_model;
save_tiny_model('tiny-qwen2')"``)::

    python recipes/textarena_games.py --config recipes/configs/textarena_games_grpo.yaml --model_name_or_path tiny-qwen2 \\
        --max_steps 2 --eval_games 4 --output_dir outputs/textarena-tiny
"""

from dataclasses import dataclass, field

from trl_agentic.evaluate.training import train_between_evaluations
from trl_agentic.integrations.textarena import game_reward, textarena_dataset, textarena_environment
from trl_agentic.scripts import AgenticScriptArguments, load_tokenizer, run, trainer_class

HELD_OUT_SEED = 1_000_000


@dataclass
class TextArenaScriptArguments(AgenticScriptArguments):
    """TRL's ``ScriptArguments`` and ``algo``, and the game: its id, how many games to train and evaluate on."""

    game_id: str = field(default="GuessTheNumber-v0", metadata={"help": "A single-player TextArena game id."})
    num_games: int = field(default=512, metadata={"help": "Training rows: game seeds 0 .. num_games - 1."})
    eval_games: int = field(default=64, metadata={"help": "Held-out games, evaluated before and after training "
                                                          "(0: none)."})
    prompt: str = field(default="", metadata={"help": "Text before the game's first observation in each prompt."})


def main(script_args, training_args, model_args) -> None:
    processing_class = load_tokenizer(model_args.model_name_or_path, revision=model_args.model_revision)
    environment = textarena_environment(script_args.game_id)
    train = textarena_dataset(script_args.num_games, prompt=script_args.prompt)
    held_out = list(textarena_dataset(script_args.eval_games, seed=HELD_OUT_SEED, prompt=script_args.prompt))
    trainer = trainer_class(script_args.algo)(model=model_args.model_name_or_path, processing_class=processing_class,
                                              environment=environment, reward_funcs=game_reward(),
                                              train_dataset=train, args=training_args)

    train_between_evaluations(trainer, held_out, game_reward(), {"environment": environment},
                              {"accuracy": "success", "mean_reward": "reward"}, {"game_id": script_args.game_id})

if __name__ == "__main__":
    raise SystemExit(run(main, TextArenaScriptArguments, prog="python recipes/textarena_games.py"))
