"""sage_trl: TRL-style training of video models with SAGE-GRPO."""
