"""``sage-train``: the main job. With no arguments it trains SAGE-GRPO with LoRA on the built-in toy world on a CPU
(the ``toy`` preset, `sage_trl.presets`); ``--preset``, ``--config run.yaml`` and ``--<field> value`` select anything
else, TRL-style (every field of `SageGRPOConfig` and `TrainScriptArguments`), in that order of precedence.
``--preflight`` prints the full-size memory and compute plan instead of training. ``sage-generate`` lives in
`sage_trl.generate` and ``sage-push`` in `sage_trl.hub`.
"""

from sage_trl.cli.arguments import TrainScriptArguments
from sage_trl.cli.parsing import parse_train_arguments
from sage_trl.cli.resolve import resolve_eval_prompts, resolve_reward, resolve_train_prompts
from sage_trl.cli.train import resume_argument, run_training, train_main

__all__ = [
    "TrainScriptArguments",
    "parse_train_arguments",
    "resolve_eval_prompts",
    "resolve_reward",
    "resolve_train_prompts",
    "resume_argument",
    "run_training",
    "train_main",
]
