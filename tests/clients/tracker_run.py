"""Train the tiny trainer two steps with ``report_to=<tracker>`` in a fresh process (the trackers read their
environment variables at import), evaluating two held-out prompts after step 2 (a video per evaluation), for
tests/clients/test_trackers.py.

    python tests/clients/tracker_run.py TRACKER OUTPUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.sage_trl.tiny_trainer import make_trainer

if __name__ == "__main__":
    tracker, output_dir = sys.argv[1], Path(sys.argv[2])
    trainer = make_trainer(
        output_dir.parent,
        output_dir=str(output_dir),
        report_to=tracker,
        run_name="sage-grpo-tracker-test",
        project="sage-grpo-tests",
        eval_dataset=["a held-out ball", "a held-out cube"],
        eval_strategy="steps",
        eval_steps=2,
        eval_seeds=[0],
    )
    trainer.train()
