"""The bad-input sweep: what a user who mistypes gets from every entry point.

Each case must fail (a non-zero exit or an exception) with a message naming the offending field or path; the
``sage-train`` and ``sage-generate`` cases must fail before any video model is loaded, and ``sage-train`` without
changing an existing run folder. One module per entry point: ``sage-train`` (its flags and its config file; config,
prompt and resume files in `test_files`), `SageGRPOConfig`, the environment, the SDE step, rewards and VideoAlign,
``sage-push`` and ``sage-generate``.
"""
