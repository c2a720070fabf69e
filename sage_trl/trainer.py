"""`SageGRPOTrainer`: TRL's GRPOTrainer for flow-matching video models, trained on `sage_env` rollouts.

What it reuses from TRL (see `sage_trl._trl_compat`): the group-repeat sampler, the training step and metric
logging; generation buffering follows TRL's schedule, over slices of an `agents.ScoredTrajectory` (the one form a
rollout takes from the environment to the loss) instead of TRL's dicts of tensors. What it adds: rollouts through
`sage_env.DenoisingVectorEnv` with the reset options the algorithm asks for, the loss of any registered algorithm
(`agents`; SAGE-GRPO by default), LoRA through peft with the moving anchor as an adapter snapshot; and, through
`sage_trl.run_folder_trainer.RunFolderTrainerMixin`, a run folder that is claimed, resumed and finished by rule,
diffusers-format saving, checkpoints that resume exactly and the Hub push.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
import torch
from accelerate.utils import gather, gather_object
from datasets import Dataset
from transformers import TrainerCallback, set_seed
from transformers.utils import logging
from trl import GRPOTrainer

from agents import ALGORITHM_CLASSES, Algorithm, References, RolloutShape, ScoredTrajectory
from agents.diagnostics import PER_STEP_METRICS, PER_STEP_PREFIX, per_step_prefix
from agents.rollout import fraction_of_groups_without_spread
from sage_env.backbones import VideoBackbone
from sage_env.env import BackbonePolicy, Trajectory, run_episode
from sage_env.rewards import CompositeReward, RewardFailureMonitor
from sage_trl import _trl_compat
from sage_trl import training_setup as setup
from sage_trl.alarm_callback import AlarmCallback
from sage_trl.config import SageGRPOConfig
from sage_trl.distributed import check_launch, parameters_outside, release_process_group_at_exit
from sage_trl.evaluation_trainer import EvaluationTrainerMixin
from sage_trl.experts import EXPERT_METRICS, expert_groups, expert_parameter_groups, routed_to
from sage_trl.gradient_probe import GradientProbe
from sage_trl.lora import add_lora
from sage_trl.model_facts import check_model_facts
from sage_trl.outputs import MetricsFileCallback
from sage_trl.run_folder import layout
from sage_trl.run_folder_trainer import RunFolderTrainerMixin
from sage_trl.trainer_state import TrainerStateMixin

__all__ = ["SageGRPOTrainer"]

logger = logging.get_logger(__name__)


class _AlgorithmCallback(TrainerCallback):
    """Around every optimizer step (on every process): no update from rollouts without a single valid reward;
    after it, the KL coefficient update and the moving-anchor refresh."""

    def __init__(self, trainer: SageGRPOTrainer) -> None:
        self.trainer = trainer

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer._drop_update_without_valid_rewards()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer._after_optimizer_step()


class SageGRPOTrainer(RunFolderTrainerMixin, TrainerStateMixin, EvaluationTrainerMixin, GRPOTrainer):
    """Trainer for RL post-training of flow-matching text-to-video models (SAGE-GRPO by default).

    Args:
        model: a `VideoBackbone`, or a path / Hub id / ``"toy"`` loaded with `sage_env.backbones.load_backbone`
            (None: ``args.model_name_or_path``).
        reward_funcs: a reward function, a list of them, or a `sage_env.rewards.CompositeReward`; weighted by
            ``args.reward_weights`` (one per function, TRL style), ``args.reward_component_weights`` or
            ``args.reward_preset``.
        args: a `SageGRPOConfig`.
        train_dataset: a `datasets.Dataset` with a ``prompt`` column, or a list of prompt strings.
        eval_dataset: held-out prompts in the same forms, sampled once per ``args.eval_seeds`` seed by ``evaluate``
            (``args.eval_strategy="steps"`` with ``eval_steps``: during training; `EvaluationTrainerMixin`).
        callbacks: extra `transformers.TrainerCallback` objects.
        optimizers: ``(optimizer, lr_scheduler)`` as in `transformers.Trainer`.
        peft_config: a ``peft.LoraConfig`` to train a LoRA adapter (targets default to the backbone's); full
            fine-tuning when None.
        eval_reward_funcs: evaluation rewards in the forms of ``reward_funcs`` (their own default weights):
            scored on the held-out videos at every evaluation and logged (``eval_eval_reward/...``), never optimised.

    ``processing_class``, ``reward_processing_classes``, ``tools``, ``rollout_func``, ``environment_factory`` and
    ``quantization_config`` are accepted for signature compatibility with `GRPOTrainer` and raise when set.
    """

    _tag_names: ClassVar[list[str]] = ["trl", "sage-grpo", "text-to-video"]
    _name = "SAGE-GRPO"
    loss_is_scaled_for_ga = True  # compute_loss divides by the accumulation steps itself

    def __init__(
        self,
        model: VideoBackbone | str | None,
        reward_funcs: Callable | Sequence[Callable] | CompositeReward,
        args: SageGRPOConfig | None = None,
        train_dataset: Dataset | Sequence[str] | None = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        reward_processing_classes: Any = None,
        callbacks: list[TrainerCallback] | None = None,
        optimizers: tuple[Any, Any] = (None, None),
        quantization_config: Any = None,
        peft_config: Any = None,
        tools: Any = None,
        rollout_func: Any = None,
        environment_factory: Any = None,
        eval_reward_funcs: Callable | Sequence[Callable] | CompositeReward | None = None,
    ) -> None:
        setup.refuse_unsupported_arguments(locals())
        args = args if args is not None else SageGRPOConfig(output_dir="sage-grpo-output")
        if not isinstance(args, SageGRPOConfig):
            raise ValueError(f"args must be a SageGRPOConfig, got {type(args).__name__}.")
        eval_dataset = setup.held_out_prompts(args, eval_dataset)
        set_seed(args.seed)  # the adapter's random init must follow the run's seed
        train_dataset = setup.prompt_dataset(train_dataset)
        self._load_backbone(model, args, peft_config, train_dataset["prompt"])
        self.peft_config = add_lora(self.backbone, peft_config) if peft_config is not None else None
        if peft_config is None:
            self.backbone.transformer.requires_grad_(True)
        algorithm_config = args.algorithm_config()
        # TRL's seed seeds the timestep selection, as it seeds the rollouts (resume and --seed reproduce runs).
        self.algorithm: Algorithm = ALGORITHM_CLASSES[args.algorithm](algorithm_config, seed=args.seed)
        self.reward = setup.composite_reward(reward_funcs, args)
        self.eval_reward = setup.evaluation_reward(eval_reward_funcs)
        self.dataset_name: str | None = train_dataset.info.dataset_name
        _trl_compat.make_config_reportable(self.backbone.transformer)
        _trl_compat.transformers_trainer_init(
            self,
            model=self.backbone.transformer,
            args=args,
            data_collator=_trl_compat.grpo_data_collator,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            callbacks=callbacks,
            optimizers=optimizers,
        )
        check_launch(self.accelerator)
        setup.check_expert_launch(self.backbone, args, self.accelerator.num_processes, self.is_deepspeed_enabled)
        _trl_compat.init_grpo_state(self, args)
        self._init_rollout_and_loss_state(args)

    def _load_backbone(
        self, model: VideoBackbone | str | None, args: SageGRPOConfig, peft_config: Any, prompts: list[str]
    ) -> None:
        """The backbone in the run's dtype, the model's defaults filled into ``args``, and with
        ``precompute_prompt_embeddings`` the prompts encoded before the transformer comes to the device."""
        if model is None or isinstance(model, str):
            check_model_facts(args, peft_config, model_name_or_path=model)
        self.backbone = setup.load_training_backbone(model, args, lora=peft_config is not None)
        self.model_name_or_path = model if isinstance(model, str) else args.model_name_or_path
        self.pipeline_class = setup.pipeline_class_name(self.backbone)
        args.resolve_model_defaults(self.pipeline_class)
        setup.check_video_size(args)
        if args.precompute_prompt_embeddings:
            setup.precompute_prompt_embeddings(
                self.backbone, prompts, args.negative_prompt, args.device, args.prompt_encode_batch_size
            )

    def _init_rollout_and_loss_state(self, args: SageGRPOConfig) -> None:
        """After transformers' and TRL's state: memory savers, references, environment, counters, callbacks."""
        setup.enable_memory_savers(self.backbone, args)  # each leaves the training result unchanged
        self.references: References = self.algorithm.build_references(self.backbone.transformer)
        self.env = setup.training_env(self.backbone, self.reward, args, self.accelerator.device)
        # The config checked the rollouts where it knew the schedule; the model's own step count is known only now.
        self.algorithm.config.check_rollouts(args.num_generations, self._rollout_shape().stochastic_steps)
        self._generation_round = 0
        self.resolved_reward_weights: dict[str, float] = {}
        self.reward_failures = RewardFailureMonitor(args.max_consecutive_reward_failures)
        self._kl_values: list[float] = []
        self._step_had_valid = False  # any sample of this optimizer step with a valid reward (this process)
        # Under DDP: the trainable parameters the loss does not reach (found on the first loss).
        self._unreached: list[torch.nn.Parameter] | None = None
        self._gradient_probe = GradientProbe(self)  # gradient_norm_steps: the gradient norm per denoising step
        self.add_callback(_AlgorithmCallback(self))
        self.add_callback(AlarmCallback(self))  # self.alarms: the alarms that fired; self.stopped_by_alarm
        if self.is_world_process_zero():
            self.add_callback(MetricsFileCallback(os.path.join(args.output_dir, layout.METRICS_FILE)))
        if self.accelerator.num_processes > 1:
            release_process_group_at_exit(self)

    def create_optimizer(self, model: torch.nn.Module | None = None) -> torch.optim.Optimizer:
        """transformers' optimizer; with several trained experts, one parameter group per expert and weight-decay
        class (`sage_trl.experts.expert_parameter_groups`)."""
        optimizer = super().create_optimizer(model)
        names = self.backbone.expert_names
        groups = expert_parameter_groups(optimizer.param_groups, self.backbone.transformer, names)
        if len({group["expert"] for group in groups}) > 1:  # not when one expert trains
            optimizer.param_groups = []  # no state yet: regrouping the same parameters changes nothing else
            for group in groups:
                optimizer.add_param_group(group)
        return optimizer

    def _get_train_sampler(self, dataset: Dataset | None = None) -> _trl_compat.EpochSeededRepeatSampler:
        """GRPO's group-repeat sampler, shuffled per epoch from the seed so that resuming is exact."""
        return _trl_compat.EpochSeededRepeatSampler.like(super()._get_train_sampler(dataset))

    # -- rollouts --------------------------------------------------------------------------------

    def _rollout_seeds(self, count: int) -> list[int]:
        """One seed per sample from (seed, generation round, global sample index): a sample's noise does not
        depend on how many processes share the batch."""
        offset = self.accelerator.process_index * count
        base = np.random.SeedSequence([self.args.seed, self._generation_round])
        seeds = base.generate_state(offset + count, dtype=np.uint32)[offset:]
        return [int(s) & 0x7FFFFFFF for s in seeds]

    def _rollout_shape(self) -> RolloutShape:
        """The training environment's schedule and SDE window with the trainer's group size, as the algorithm shapes
        rollouts from. Not `agents.rollout_shape(self.env)`: this environment is built with ``group_size`` 1 (the
        group-repeat sampler repeats each prompt ``num_generations`` times), so the group size is the trainer's."""
        return RolloutShape(self.env.sigmas, self.num_generations, self.env.sde_window)

    def _rollout(self, prompts: list[str], seeds: list[int]) -> Trajectory:
        policy = BackbonePolicy(
            self.backbone, self.args.guidance_scale, self.args.negative_prompt, self.args.rollout_batch_size
        )
        self.backbone.encode_prompts(prompts, self.args.negative_prompt)
        if self.args.offload_text_encoders:
            self.backbone.offload_text_encoders()
        was_training = self.backbone.transformer.training
        self.backbone.transformer.eval()
        options = {
            **self.algorithm.rollout_options(self._rollout_shape()),
            "prompts": prompts,
            "seeds": seeds,
        }
        try:
            return run_episode(self.env, policy, options=options)
        finally:
            self.backbone.transformer.train(was_training)

    def _prepare_inputs(self, generation_batch: list[dict[str, Any]]) -> ScoredTrajectory:
        """This step's slice of the buffered rollout, rolling out anew every ``steps_per_generation x
        num_iterations`` steps (TRL's schedule and shuffle: the same global-RNG permutation, contiguous slices)."""
        generate_every = self.args.steps_per_generation * self.num_iterations
        if self._step % generate_every == 0 or self._buffered_inputs is None:
            rollout = self._generate_and_score_completions(generation_batch)
            order = torch.randperm(len(rollout))
            size = len(rollout) // self.args.steps_per_generation
            self._buffered_inputs = [
                rollout.select(order[index * size : (index + 1) * size])
                for index in range(self.args.steps_per_generation)
            ]
        return self._buffered_inputs[self._step % self.args.steps_per_generation]

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> ScoredTrajectory:
        """Roll out the local prompts, gather rewards across processes, and return the local rollout with its
        advantages (without the decoded videos, which training does not read)."""
        if not self.model.training:
            raise ValueError("Evaluation is not supported by SageGRPOTrainer yet.")
        prompts = [row["prompt"] for row in inputs]
        start = time.perf_counter()
        trajectory = self._rollout(prompts, self._rollout_seeds(len(prompts)))
        self._generation_round += 1
        self.resolved_reward_weights.update(trajectory.rewards.weights)
        if self.args.reward_offload:
            self._offload_reward_models()
        rollout_time = time.perf_counter() - start
        advantages, usable = self._global_advantages(trajectory, prompts)
        self._log_rollout_metrics(trajectory, rollout_time, time.perf_counter() - start - rollout_time)
        self._check_reward_failures(trajectory)
        return ScoredTrajectory(replace(trajectory, videos=None), advantages, usable)

    def _check_reward_failures(self, trajectory: Trajectory) -> None:
        """Count rollouts without a single valid reward (all processes); stop after too many in a row. Such a
        rollout is reported now, and the optimizer steps it feeds change no weight (`_drop_update_without_valid_rewards`)."""
        device = self.accelerator.device
        valid = gather(trajectory.rewards.valid.to(device))
        self.reward_failures.observe(int(valid.sum()), len(valid), trajectory.rewards.errors)
        if not valid.any():
            reason = next((error for error in trajectory.rewards.errors if error), "no reward was valid")
            logger.warning(
                "Every reward of this rollout failed (%s): it trains nothing (%d of %d such rollouts in a row allowed).",
                reason,
                self.reward_failures.consecutive,
                self.args.max_consecutive_reward_failures,
            )

    def _offload_reward_models(self) -> None:
        """Move reward models off the accelerator until the next scoring call (``reward_offload``)."""
        for reward_fn in self.reward.reward_funcs:
            if callable(getattr(reward_fn, "offload", None)):
                reward_fn.offload()

    def _global_advantages(
        self, trajectory: Trajectory, prompts: list[str]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Advantages over all processes' samples (groups may span processes), sliced to this process."""
        device = self.accelerator.device
        rewards = trajectory.rewards
        total = gather(rewards.total.to(device))
        valid = gather(rewards.valid.to(device))
        all_prompts = gather_object(prompts)
        group_index = torch.arange(len(total), device=device) // self.num_generations
        advantages, usable = self.algorithm.compute_advantages(all_prompts, total, valid, group_index)
        local = slice(
            self.accelerator.process_index * len(prompts), (self.accelerator.process_index + 1) * len(prompts)
        )
        self._metrics["train"]["advantage_mean_abs"].append(
            float(advantages[usable].abs().mean()) if usable.any() else 0.0
        )
        without = fraction_of_groups_without_spread(total, valid, group_index)
        self._metrics["train"]["frac_groups_without_signal"].append(without)
        return advantages[local].to(device), usable[local].to(device)

    def _log_rollout_metrics(self, trajectory: Trajectory, rollout_time: float, scoring_time: float) -> None:
        rewards, device, metrics = trajectory.rewards, self.accelerator.device, self._metrics["train"]
        valid = gather(rewards.valid.to(device))
        for name, scores in sorted(rewards.components.items()):
            values = gather(scores.to(device))
            metrics[f"reward/{name}"].append(float(values[valid].mean()) if valid.any() else float("nan"))
        total = gather(rewards.total.to(device))
        metrics["reward/total"].append(float(total[valid].mean()) if valid.any() else float("nan"))
        metrics["reward/total_std"].append(
            float(total[valid].std(unbiased=False)) if valid.sum() > 1 else 0.0
        )
        metrics["reward/invalid_count"].append(float((~valid).sum()))
        metrics["diagnostics/invalid_reward_fraction"].append(float((~valid).float().mean()))
        failed = gather(torch.tensor([rewards.failed_calls], device=device))
        metrics["reward/failed_calls"].append(float(failed.sum()))
        stds = trajectory.stds[trajectory.trainable].double()
        std_sum, count = gather(
            torch.stack([stds.sum(), stds.new_tensor(stds.numel())])[None].to(device)
        ).sum(0)
        metrics["rollout/exploration_std"].append(float(std_sum / count) if count else 0.0)
        metrics["time/rollout"].append(rollout_time)
        metrics["time/advantages"].append(scoring_time)

    # -- loss ------------------------------------------------------------------------------------

    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: ScoredTrajectory,
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> torch.Tensor:
        """Loss of this step's samples over their selected timesteps, in micro-batches of pairs.

        All micro-batches but the last are backpropagated here without gradient synchronisation; the last
        one's loss is returned for `transformers.Trainer.training_step` to backpropagate (and synchronise).

        Over several processes the loss is the mean over all processes' pairs, as in one process: each process
        weights its own mean by its share of the pairs (DDP and FSDP then average the gradients), every process
        runs the same number of micro-batches, at least one (a process with fewer pairs adds weightless ones:
        every FSDP forward gathers weights from all processes, and a step whose groups all lack signal still
        steps every weight with a zero gradient), and the metrics and the returned value (what transformers logs
        as ``loss``) are reduced over processes.
        """
        if return_outputs:
            raise ValueError("SageGRPOTrainer.compute_loss does not return outputs.")
        start = time.perf_counter()
        self._step_had_valid = self._step_had_valid or bool(inputs.trajectory.rewards.valid.any())
        batch = self._step_transitions(inputs)
        self._gradient_probe(batch)
        chunks = self._loss_chunks(batch, inputs)
        totals: dict[str, float] = defaultdict(float)
        several = len(self.backbone.expert_names) > 1
        for index, (chunk, pairs, expert, weight) in enumerate(chunks):
            loss, metrics = self._chunk_loss(model, chunk)
            for name, value in {**metrics, "loss": loss.detach()}.items():
                totals[name] += float(value) * pairs
            if several:  # the same names on every process: each runs every expert's rounds
                prefix = f"expert/{self.backbone.expert_names[expert]}/"
                totals[prefix + "pairs"] += pairs
                for name in EXPERT_METRICS:
                    totals[prefix + name] += float(metrics.get(name, 0.0)) * pairs
            weighted = loss * (weight / self.current_gradient_accumulation_steps)
            if index < len(chunks) - 1:
                with self.accelerator.no_sync(model):
                    self.accelerator.backward(weighted)
        for step in range(self.env.num_steps):  # the same names on every process, whichever steps it trained
            for name in PER_STEP_METRICS:
                totals[per_step_prefix(step) + name] += 0.0
        mean_loss = self._record_step_metrics(totals, sum(c[1] for c in chunks), time.perf_counter() - start)
        # The gradient is the last micro-batch's; the value is the step's loss over all processes.
        return weighted + (mean_loss / self.current_gradient_accumulation_steps - float(weighted.detach()))

    def _step_transitions(self, inputs: ScoredTrajectory, usable: torch.Tensor | None = None) -> Any:
        """The algorithm's training batch of this step's samples (``usable``: which samples; the inputs' by
        default)."""
        return self.algorithm.training_batch(
            inputs.trajectory,
            inputs.advantages,
            inputs.usable if usable is None else usable,
            self.backbone,
            on_policy=self._on_policy(),
        )

    def _loss_chunks(self, batch: Any, inputs: ScoredTrajectory) -> list[tuple[Any, int, int, float]]:
        """``[(micro-batch, pairs it counts for, expert, loss weight)]``: each trained expert's pairs in micro-batches
        of their own (`sage_trl.experts`), the same number of each expert's micro-batches on every process, at least
        one in all. The weight, ``processes x pairs / that expert's pairs on all processes``, makes each expert's
        loss the mean over its own pairs once DDP or FSDP average the processes' gradients (0 for padding)."""
        size = max(len(batch), 1) if self.is_deepspeed_enabled else self.args.micro_batch_size
        groups = {e: list(rows.chunks(size)) if len(rows) else [] for e, rows in expert_groups(batch, self.backbone).items()}
        local = [len(chunks) for chunks in groups.values()] + [sum(len(c) for c in chunks) for chunks in groups.values()]
        counts = self.accelerator.gather(torch.tensor([local], device=self.accelerator.device))
        rounds = counts[:, : len(groups)].max(0).values.tolist()
        totals = counts[:, len(groups) :].sum(0).tolist()
        if not any(rounds):
            rounds[0] = 1
        chunks = []
        for (expert, expert_chunks), expert_rounds, total in zip(groups.items(), rounds, totals):
            chunks += [(chunk, len(chunk), expert, len(counts) * len(chunk) / total) for chunk in expert_chunks]
            if len(expert_chunks) < expert_rounds:
                padding = routed_to(self._padding_chunk(batch, inputs, size), inputs.trajectory, self.backbone, expert)
                chunks += [(padding, 0, expert, 0.0)] * (expert_rounds - len(expert_chunks))
        return chunks

    def _padding_chunk(self, batch: Any, inputs: ScoredTrajectory, size: int) -> Any:
        """A micro-batch to run with weight 0 (its forwards take part in FSDP's gathers, it trains nothing)."""
        if len(batch):
            return next(batch.chunks(size))
        generator = self.algorithm.generator.get_state()  # padding must not change the timesteps drawn next
        everything = self._step_transitions(inputs, usable=torch.ones_like(inputs.usable))
        self.algorithm.generator.set_state(generator)
        return next(everything.chunks(size))

    def _on_policy(self) -> bool:
        """True when every step of a generation cycle comes before its first optimizer step (as in TRL)."""
        generate_every = self.args.steps_per_generation * self.num_iterations
        return self.args.gradient_accumulation_steps % generate_every == 0

    def _chunk_loss(self, model: torch.nn.Module, chunk: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss, metrics = self.algorithm.loss(self._policy_view(model), chunk, self.references)
        return self._reaching_every_parameter(model, loss), metrics

    def _reaching_every_parameter(self, model: torch.nn.Module, loss: torch.Tensor) -> torch.Tensor:
        """Under DDP, ``loss`` plus zero times each trainable parameter it does not reach, so that DDP needs no
        search for unused parameters (`sage_trl.distributed`); the parameters are found on the first loss."""
        if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
            return loss
        if self._unreached is None or len(self.backbone.expert_names) > 1:  # each expert's micro-batch reaches its own
            self._unreached = parameters_outside(loss, model.module)
        return loss + sum(p.sum() for p in self._unreached) * 0.0 if self._unreached else loss

    def _policy_view(self, model: torch.nn.Module) -> VideoBackbone:
        """The backbone, calling the (possibly DDP-wrapped) ``model`` for its forward."""
        if model is self.backbone.transformer:
            return self.backbone
        return _WrappedPolicy(self.backbone, model)

    def _record_step_metrics(self, totals: dict[str, float], pairs: int, seconds: float) -> float:
        """Log the means over all processes' pairs of the per-pair sums ``totals``; returns the mean loss.

        One reduction over processes (every process calls it, with the same metric names).
        """
        names = sorted(totals)
        local = torch.tensor(
            [*(totals[n] for n in names), pairs], dtype=torch.float64, device=self.accelerator.device
        )
        summed = dict(zip([*names, ""], self.accelerator.reduce(local, "sum").tolist()))
        means = {}
        for name in names:
            # an expert's or a denoising step's metrics are means over that expert's or step's pairs
            scope = "/".join(name.split("/")[:2]) + "/" if name.startswith(("expert/", PER_STEP_PREFIX)) else ""
            count = summed[scope + "pairs"] if scope else summed[""]
            if count and not name.endswith("/pairs"):
                means[name] = summed[name] / count
        for name, value in means.items():
            if name != "loss":
                self._metrics["train"][name].append(value)
        self._metrics["train"]["time/train_step"].append(seconds)
        self._kl_values.append(means.get("kl/total", 0.0))
        return means.get("loss", 0.0)

    def _drop_update_without_valid_rewards(self) -> None:
        """Before the optimizer steps: when none of this step's samples, on any process, had a valid reward, its
        gradient is dropped (set to None, which AdamW skips: no momentum, no weight decay), so a step of failed
        rewards changes no weight. DeepSpeed steps its own copies of the gradients and still takes the step."""
        had_valid = torch.tensor([float(self._step_had_valid)], device=self.accelerator.device)
        self._step_had_valid = False
        if float(self.accelerator.reduce(had_valid, "sum")) > 0:
            return
        for parameter in self.backbone.transformer.parameters():
            parameter.grad = None
        self._metrics["train"]["reward/update_dropped"].append(1.0)

    def _after_optimizer_step(self) -> None:
        # The recorded KL values are means over all processes already: every process takes the same decision.
        kl_value = sum(self._kl_values) / len(self._kl_values) if self._kl_values else 0.0
        self._kl_values = []
        self.algorithm.after_optimizer_step(kl_value, self.references)


class _WrappedPolicy:
    """A view of a backbone whose `predict_velocity` calls another module (the DDP-wrapped transformer)."""

    def __init__(self, backbone: VideoBackbone, module: torch.nn.Module) -> None:
        self.backbone, self.module = backbone, module

    def predict_velocity(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.backbone.predict_velocity(*args, transformer=self.module, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backbone, name)
