"""Every private name of trl and transformers that `SageGRPOTrainer` relies on, in one place.

trl's `GRPOTrainer.__init__` is LLM-only (tokenizer, text config, LM head), so `SageGRPOTrainer`
skips it and sets up, here, the state that the GRPOTrainer methods it reuses read:

* `GRPOTrainer.get_train_dataloader` / `_get_train_sampler`: the group-repeat sampler (each prompt
  ``num_generations`` times, groups spanning processes, batches reused ``num_iterations`` times);
* `GRPOTrainer.training_step`: step counting and timing around `transformers.Trainer.training_step`;
* `GRPOTrainer.log`: metric averaging and logging through ``report_to``.

``tests/sage_trl/test_trl_compat.py`` checks this contract against the installed trl: the reused methods
exist and every ``self.<attribute>`` they read is set by `init_grpo_state`. The trl range in pyproject.toml is
the one CI tests: the whole suite on its newest version, the trainer and client tests on its lowest.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict, deque
from typing import Any

import numpy as np
import torch
from diffusers.configuration_utils import FrozenDict
from transformers import Trainer
from trl import GRPOTrainer
from trl.trainer.utils import RepeatSampler, identity

__all__ = [
    "GRPO_REUSED_METHODS",
    "TRAINER_PRIVATE_METHODS",
    "TRAIN_TIME_ATTRIBUTES",
    "EpochSeededRepeatSampler",
    "ReportableConfig",
    "grpo_data_collator",
    "init_grpo_state",
    "make_config_reportable",
    "rotate_checkpoints",
    "save_trainer_checkpoint_parts",
    "transformers_trainer_init",
]

GRPO_REUSED_METHODS = (
    "get_train_dataloader",
    "training_step",
    "log",
    "_set_signature_columns_if_needed",
)
"""GRPOTrainer methods SageGRPOTrainer inherits unchanged."""

TRAINER_PRIVATE_METHODS = (
    "_save_optimizer_and_scheduler",
    "_save_scaler",
    "_save_rng_state",
    "_get_output_dir",
    "store_flos",
    "_push_from_checkpoint",
)
"""transformers.Trainer methods used to write checkpoints atomically (see `save_trainer_checkpoint_parts`)."""

TRAIN_TIME_ATTRIBUTES = ("current_gradient_accumulation_steps",)
"""Attributes the reused methods read that `transformers.Trainer` sets when training starts."""

grpo_data_collator = identity
"""GRPO's collator: rows are passed through as a list of dicts."""


def transformers_trainer_init(trainer: GRPOTrainer, **kwargs: Any) -> None:
    """Run `transformers.Trainer.__init__` without GRPOTrainer's LLM set-up.

    TRL's base class is skipped too: its only addition is telemetry, which reads ``model.config.model_type``
    (diffusers configs have none) and would try the network; and the gradient-accumulation flag it patches
    for transformers < 5.19 is not needed (pyproject requires >= 5.19).
    """
    Trainer.__init__(trainer, **kwargs)


def init_grpo_state(trainer: GRPOTrainer, args: Any) -> None:
    """Set the attributes that the reused GRPOTrainer methods read (mirrors `GRPOTrainer.__init__`)."""
    trainer.num_generations = args.num_generations
    trainer.num_generations_eval = args.num_generations_eval or args.num_generations
    trainer.num_iterations = args.num_iterations
    trainer.shuffle_dataset = args.shuffle_dataset
    trainer.scale_rewards = args.scale_rewards
    trainer.epsilon_low = args.epsilon
    trainer.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    trainer.beta = args.beta
    trainer._step = 0
    trainer._buffered_inputs = None
    trainer._current_train_step_time = 0.0
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    trainer._total_train_tokens = 0
    trainer.log_completions = False  # completions are videos: logged by the trainer's own callbacks
    trainer.log_multimodal = False
    trainer.log_unique_prompts = False
    trainer.num_completions_to_print = 0
    trainer.use_adaptive_entropy = False
    trainer._logs = {
        "prompt": deque(maxlen=args.generation_batch_size),
        "completion": deque(maxlen=args.generation_batch_size),
        "rewards": defaultdict(lambda: deque(maxlen=args.generation_batch_size)),
        "advantages": deque(maxlen=args.generation_batch_size),
        "extra": defaultdict(lambda: deque(maxlen=args.generation_batch_size)),
        "images": deque(maxlen=args.generation_batch_size),
    }


def save_trainer_checkpoint_parts(trainer: Trainer, output_dir: str) -> None:
    """Write what `transformers.Trainer._save_checkpoint` writes besides the model: optimizer, scheduler,
    scaler, RNG states and the trainer state (with its stateful callbacks)."""
    from transformers.trainer import TRAINER_STATE_NAME
    from transformers.trainer_callback import ExportableState

    if not trainer.args.save_only_model:
        trainer._save_optimizer_and_scheduler(output_dir)
        trainer._save_scaler(output_dir)
        trainer._save_rng_state(output_dir)
    if trainer.args.should_save:
        for callback in [*trainer.callback_handler.callbacks, trainer.control]:
            if isinstance(callback, ExportableState):
                name = callback.__class__.__name__
                if isinstance(trainer.state.stateful_callbacks.get(name), list):
                    trainer.state.stateful_callbacks[name].append(callback.state())
                else:
                    trainer.state.stateful_callbacks[name] = callback.state()
        trainer.state.save_to_json(os.path.join(output_dir, TRAINER_STATE_NAME))


def rotate_checkpoints(trainer: Trainer, run_dir: str) -> None:
    """Delete checkpoints beyond ``save_total_limit`` as `transformers.Trainer` does."""
    from transformers.trainer_utils import rotate_checkpoints as _rotate

    _rotate(
        output_dir=run_dir,
        save_total_limit=trainer.args.save_total_limit,
        best_model_checkpoint=trainer.state.best_model_checkpoint,
        use_mtime=True,
    )


class EpochSeededRepeatSampler(RepeatSampler):
    """TRL's `RepeatSampler` (each prompt ``num_generations`` times, batches repeated for reuse) whose shuffle is a
    function of ``(seed, epoch)``.

    TRL's sampler draws every epoch's permutation from one generator that lives only in memory, so a run resumed
    in epoch 2 replays epoch 1's order: the resumed run trains on other prompts than the uninterrupted one.
    `transformers.Trainer` calls ``set_epoch`` before every epoch (through accelerate's data loader), which
    reseeds the generator here; resume is then exact at any step.
    """

    @classmethod
    def like(cls, sampler: RepeatSampler) -> EpochSeededRepeatSampler:
        """The same sampler, epoch-seeded."""
        return cls(
            data_source=sampler.data_source,
            mini_repeat_count=sampler.mini_repeat_count,
            batch_size=sampler.batch_size,
            repeat_count=sampler.repeat_count,
            shuffle=sampler.shuffle,
            seed=sampler.seed,
        )

    def set_epoch(self, epoch: int) -> None:
        """Reseed the shuffle for ``epoch``."""
        if self.shuffle:
            seed = np.random.SeedSequence([self.seed or 0, epoch]).generate_state(1)[0]
            self.generator = torch.Generator().manual_seed(int(seed))


class ReportableConfig(FrozenDict):
    """A diffusers model config that transformers' reporting callbacks can read.

    `transformers.Trainer`'s integrations (TensorBoard, MLflow, ...) call ``model.config.to_json_string()`` or
    ``.to_dict()`` on train start, methods of transformers' ``PretrainedConfig`` that diffusers' ``FrozenDict``
    lacks (``report_to="tensorboard"`` crashed with an ``AttributeError``). This subclass adds them and is
    otherwise the same ``FrozenDict``.
    """

    def to_dict(self) -> dict[str, Any]:
        """The config as a plain dict."""
        return dict(self)

    def to_json_string(self) -> str:
        """The config as JSON text (what the TensorBoard callback writes as its ``model_config`` text)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, default=str)


def make_config_reportable(module: Any) -> None:
    """Give a diffusers model's config the methods transformers' reporting callbacks call (see `ReportableConfig`)."""
    config = getattr(module, "_internal_dict", None)
    if isinstance(config, FrozenDict) and not isinstance(config, ReportableConfig):
        module._internal_dict = ReportableConfig(config)
