"""The alarms (`sage_trl.alarms`) during training: `AlarmCallback` feeds every logged record to the rules, warns,
writes each alarm to the run folder (`layout.ALARMS_FILE`) and, with ``stop_on_alarm``, stops the run;
`OffPolicyCauses` names the causes of an importance ratio off 1 that the library can see."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback
from transformers.utils import logging

from sage_trl.alarms import Alarm, AlarmMonitor, alarm_json, default_rules
from sage_trl.run_folder import layout
from sage_trl.run_folder.manifest import record_entries
from sage_trl.run_folder.writes import guarded_write

__all__ = ["AlarmCallback", "OffPolicyCauses"]

logger = logging.get_logger(__name__)


def _precision() -> str:
    """The autocast state of the current forward: ``autocast <dtype>`` or ``no autocast``."""
    for device_type in ("cuda", "cpu"):
        if torch.is_autocast_enabled(device_type):
            return f"autocast {torch.get_autocast_dtype(device_type)}"
    return "no autocast"


class OffPolicyCauses:
    """Watches the transformer's forwards (a pre-hook records the input dtype and autocast state of rollout
    forwards, without gradients, and training forwards, with them) and, when asked, names what makes the training
    forward differ from the rollout's."""

    def __init__(self, transformer: torch.nn.Module, config: Any) -> None:
        self.transformer = transformer
        self.config = config
        self.seen: dict[str, set[str]] = {"rollout": set(), "training": set()}
        transformer.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        tensor = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor) and a.is_floating_point()), None)
        dtype = f"inputs {tensor.dtype}" if tensor is not None else "inputs ?"
        self.seen["training" if torch.is_grad_enabled() else "rollout"].add(f"{dtype}, {_precision()}")

    def explain(self) -> str:
        """The causes found, each with its fix; a non-deterministic kernel when none is."""
        causes = []
        dropout = [
            f"{name} (p={module.p})"
            for name, module in self.transformer.named_modules()
            if isinstance(module, torch.nn.Dropout) and module.p > 0
        ]
        if dropout:
            shown = ", ".join(dropout[:3]) + (f" and {len(dropout) - 3} more" if len(dropout) > 3 else "")
            causes.append(
                f"Dropout is active in the training forward and not in the rollout: {shown}; set lora_dropout 0 "
                "(and the model's dropout) for RL."
            )
        rollout, training = self.seen["rollout"], self.seen["training"]
        if rollout and training and rollout != training:
            causes.append(
                f"The rollout and the training forward run in different precisions (rollout: {sorted(rollout)}; "
                f"training: {sorted(training)}): run both under the same dtype and autocast (bf16 / torch_dtype)."
            )
        rollout_batch, micro_batch = self.config.rollout_batch_size, self.config.micro_batch_size
        if rollout_batch is not None and rollout_batch != micro_batch:
            causes.append(
                f"Rollouts and training forwards batch differently (rollout_batch_size {rollout_batch}, "
                f"micro_batch_size {micro_batch}), and kernels may round by batch size: set them equal to check."
            )
        if not causes:
            causes.append(
                "No dropout, precision or batching difference is visible: a non-deterministic kernel is likely; "
                "try torch.use_deterministic_algorithms(True) (and CUBLAS_WORKSPACE_CONFIG=:4096:8 on CUDA)."
            )
        return " ".join(causes)


class AlarmCallback(TrainerCallback):
    """Checks the alarms on every logged record (on every process, which log the same gathered metrics)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.causes = OffPolicyCauses(trainer.backbone.transformer, trainer.args)
        self.monitor = AlarmMonitor(default_rules(self.causes.explain))
        trainer.alarms: list[Alarm] = []  # the alarms that fired, in order
        trainer.stopped_by_alarm: Alarm | None = None  # with stop_on_alarm: the one that stopped the run

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # A resumed run: its records up to the checkpoint, replayed without warnings (their alarms were raised).
        self.monitor = AlarmMonitor(default_rules(self.causes.explain))
        for record in state.log_history:
            self.monitor.update(record)
        self.trainer.alarms = list(self.monitor.fired)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if not logs or "train_runtime" in logs:
            return
        for alarm in self.monitor.update({**logs, "step": state.global_step}):
            logger.warning(alarm.line())
            self.trainer.alarms.append(alarm)
            if state.is_world_process_zero:
                self._write(Path(args.output_dir) / layout.ALARMS_FILE, alarm)
            if args.stop_on_alarm:
                control.should_training_stop = True
                self.trainer.stopped_by_alarm = self.trainer.stopped_by_alarm or alarm

    @staticmethod
    def _write(path: Path, alarm: Alarm) -> None:
        with guarded_write(path.name, path, survived="the checkpoints written so far are intact"):
            record_entries(path.parent, path.name)
            with path.open("a") as handle:
                handle.write(alarm_json(alarm) + "\n")
