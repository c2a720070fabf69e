"""A tiny SageGRPOTrainer run in its own process, for the run-safety tests that need a real process.

    python tests/sage_trl/run_script.py OUTPUT_DIR [--max-steps N] [--save-steps N] [--kill-at-step N]
        [--kill-during-save-at-step N] [--resume] [--fill-disk-at-step N] [--hold-lock SECONDS]

``--kill-at-step N`` sends SIGKILL to itself right after step N is logged (a real ``kill -9``: no cleanup,
no ``finally``); ``--kill-during-save-at-step N`` does so in the middle of writing checkpoint N (its weights are
in the staging folder, its state is not). ``--fill-disk-at-step N`` fills the file system of OUTPUT_DIR right after step N is logged,
so that step's checkpoint meets a full disk. ``--hold-lock S`` only claims OUTPUT_DIR's lock, prints ``locked``
and sleeps S seconds.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from transformers import TrainerCallback

from sage_trl.run_folder import acquire_lock
from tests.sage_trl.tiny_trainer import make_trainer


class KillAt(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class FillDiskAt(TrainerCallback):
    def __init__(self, step: int, folder: Path) -> None:
        self.step, self.folder = step, folder

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.global_step != self.step:
            return
        with (self.folder.parent / "filler").open("wb") as handle:
            try:
                while True:
                    handle.write(b"\0" * 65536)
                    handle.flush()
            except OSError:
                pass


def _kill_during_save(trainer, step: int) -> None:
    """SIGKILL once checkpoint ``step``'s weights are written and before its trainer state is."""
    from sage_trl import _trl_compat

    write_parts = _trl_compat.save_trainer_checkpoint_parts

    def write_then_die(trainer_, folder):
        if trainer_.state.global_step == step:
            os.kill(os.getpid(), signal.SIGKILL)
        return write_parts(trainer_, folder)

    _trl_compat.save_trainer_checkpoint_parts = write_then_die


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir", type=Path)
    parser.add_argument("--max-steps", type=int, default=4)
    parser.add_argument("--save-steps", type=int, default=2)
    parser.add_argument("--kill-at-step", type=int)
    parser.add_argument("--kill-during-save-at-step", type=int)
    parser.add_argument("--fill-disk-at-step", type=int)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--hold-lock", type=float)
    cli = parser.parse_args()
    if cli.hold_lock is not None:
        acquire_lock(cli.output_dir)
        print("locked", flush=True)
        time.sleep(cli.hold_lock)
        return
    trainer = make_trainer(
        cli.output_dir.parent,
        output_dir=str(cli.output_dir),
        max_steps=cli.max_steps,
        save_strategy="steps",
        save_steps=cli.save_steps,
    )
    if cli.kill_at_step is not None:
        trainer.add_callback(KillAt(cli.kill_at_step))
    if cli.kill_during_save_at_step is not None:
        _kill_during_save(trainer, cli.kill_during_save_at_step)
    if cli.fill_disk_at_step is not None:
        trainer.add_callback(FillDiskAt(cli.fill_disk_at_step, cli.output_dir))
    trainer.train(resume_from_checkpoint=True if cli.resume else None)


if __name__ == "__main__":
    main()
