"""The built-in toy text-to-video world: RL post-training of a video model on a laptop CPU in minutes.

* `sage_env.toy.world`: the synthetic videos (a 4-pixel coloured object moving 1 px/frame on a grey
  16 x 16 background, 8 frames), the prompt grammar ``"a {colour} {shape} moving {direction}"``, the fixed
  train / held-out split and the deterministic renderer;
* `sage_env.backbones.toy.ToyBackbone`: the prior, a tiny pixel-space flow-matching ``WanTransformer3DModel``
  shipped in ``sage_env/toy/assets/prior`` (``load_backbone("toy")``);
* `sage_env.rewards.toy.ToyReward`: the analytic VQ / MQ / TA reward (``HackableToyReward``: the gameable one);
* `sage_env.toy.gold`: the gold score, the distance of a video to the world's own videos of its prompt;
* sampling: `sage_env.env.sample_videos`, the environment's sampler, on the toy schedule by default;
* `sage_env.toy.env`: ``sage_env/Toy-v0`` (``gymnasium.make("sage_env/Toy-v0")`` needs no arguments);
* ``python -m sage_env.toy.train_prior``: the script that trained the shipped prior.

Only the world is imported here; the other modules load torch models and are imported on use.
"""

from sage_env.toy.world import (
    TOY_COLOURS,
    TOY_DIRECTIONS,
    TOY_EVAL_PROMPTS,
    TOY_HEIGHT,
    TOY_NUM_FRAMES,
    TOY_PROMPTS,
    TOY_SHAPES,
    TOY_TRAIN_PROMPTS,
    TOY_WIDTH,
    ToyPrompt,
    parse_prompt,
    render_video,
    render_videos,
)

__all__ = [
    "TOY_COLOURS",
    "TOY_DIRECTIONS",
    "TOY_EVAL_PROMPTS",
    "TOY_HEIGHT",
    "TOY_NUM_FRAMES",
    "TOY_PROMPTS",
    "TOY_SHAPES",
    "TOY_TRAIN_PROMPTS",
    "TOY_WIDTH",
    "ToyPrompt",
    "parse_prompt",
    "render_video",
    "render_videos",
]
