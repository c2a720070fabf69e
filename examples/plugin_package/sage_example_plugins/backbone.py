"""A backbone: the toy model, sampled in 4 steps instead of its 10 (its own sampling defaults, declared once)."""

from __future__ import annotations

import dataclasses

from sage_env.backbones.toy import ToyBackbone


class FastToyBackbone(ToyBackbone):
    """The toy world's model with a few-step schedule; ``gym.make("sage_env/fast_toy-v0", backbone="toy", ...)``."""

    pipeline_class = "fast_toy"
    sampling_defaults = dataclasses.replace(ToyBackbone.sampling_defaults, num_steps=4)
