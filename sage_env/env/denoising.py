"""The one sampler: a batch of videos denoised on a schedule, one SDE step at a time (`DenoisingBatch`), and `sample`.

`DenoisingBatch` holds what a batch of rollouts is while it is denoised: per-sample generators seeded with each
video's seed (the starting noise and every step's noise come from them, so a video does not depend on the batch it
is in), the latents, the schedule, and the `TrajectoryRecorder`. It advances by one step per velocity. Everything
that samples uses it: `sage_env.DenoisingVectorEnv` (one `advance` per gymnasium ``step``, the velocity from
the agent), and `sample` / `sample_videos` (the velocity from the backbone itself), which serve the evaluation
(`sage_trl.evaluation`), ``sage-generate`` on a non-diffusers backbone, and the toy world's tools (the prior's
training script, its model card).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sage_env import sde
from sage_env.backbones import VideoBackbone
from sage_env.env.branching import BranchPlan
from sage_env.env.trajectory import Trajectory, TrajectoryRecorder
from sage_env.models import SamplingDefaults
from sage_env.rewards import CompositeReward
from sage_env.sde.base import per_sample

__all__ = ["DenoisingBatch", "sample", "sample_videos", "step_sde_types"]


def step_sde_types(sde_type: str, num_steps: int, sde_window: tuple[int, int] | None) -> tuple[str, ...]:
    """The SDE type of each of ``num_steps`` steps: ``sde_type`` inside ``sde_window`` (all steps when None), the ODE
    elsewhere; a window outside ``0 <= start < end <= num_steps`` is a ``ValueError``."""
    start, end = (0, num_steps) if sde_window is None else sde_window
    if not 0 <= start < end <= num_steps:
        raise ValueError(f"sde_window {sde_window} must satisfy 0 <= start < end <= num_steps ({num_steps}).")
    return tuple(sde_type if start <= step < end else sde.ODE.name for step in range(num_steps))


class DenoisingBatch:
    """``N`` videos from pure noise (sigma 1) to the end of ``sigmas``, one SDE step per `advance`.

    Args:
        backbone: decodes the final latents (`finish`).
        prompts: the prompt of each sample; ``group_size`` consecutive samples form a group.
        seeds: ``(N,)`` per-sample seeds of the starting noise and of every step's noise.
        sigmas: ``(T + 1,)`` the schedule; ``sde_types``: the SDE type of each of the ``T`` steps.
        eta, log_prob_kind: the SDE's exploration scale and how transitions are scored.
        latent_shape: one sample's latent shape; ``device``: where latents live.
        record_means: also record each transition's mean (`Trajectory.means`).
        branching: the episode's trees (`sage_env.env.branching`): the lanes of a node share its first lane's
            starting noise, velocity and step noise until the node splits. None: every lane on its own.
        ode_solver: ``"euler"``, or ``"dpmsolver++"``: the deterministic steps after the last SDE step take the
            second-order multistep DPM-Solver++ step (`sage_env.sde.multistep`; the last step stays Euler).
    """

    def __init__(
        self,
        backbone: VideoBackbone,
        prompts: tuple[str, ...],
        group_size: int,
        seeds: torch.Tensor,
        sigmas: torch.Tensor,
        sde_types: tuple[str, ...],
        eta: float,
        log_prob_kind: str,
        latent_shape: tuple[int, ...],
        device: torch.device,
        record_means: bool = False,
        branching: BranchPlan | None = None,
        ode_solver: str = "euler",
    ) -> None:
        self.backbone, self.prompts, self.seeds = backbone, prompts, seeds
        self.sde_types, self.eta, self.log_prob_kind = sde_types, eta, log_prob_kind
        self.generators = [torch.Generator().manual_seed(int(seed)) for seed in seeds]
        self.latents = sde.sample_noise((len(prompts), *latent_shape), self.generators, device)
        self.branching = branching
        if branching is not None:  # a tree starts from its first lane's noise
            self.latents = self.latents[branching.representatives(0).to(device)]
        self.sigmas = sigmas.to(device).expand(len(prompts), -1)
        self.step_index = 0
        stochastic = [index for index, name in enumerate(sde_types) if sde.get_sde(name).stochastic]
        # Steps after the last SDE step that take the second-order update (not the last: lower-order final).
        self._second_order = range(stochastic[-1] + 1 if stochastic else 0, len(sde_types) - 1)
        self._multistep = ode_solver == "dpmsolver++"
        self._previous_prediction: tuple[torch.Tensor, torch.Tensor] | None = None
        self.recorder = TrajectoryRecorder(
            prompts, group_size, seeds, self.sigmas, self.latents, sde_types, eta, log_prob_kind, record_means,
            branching,
        )  # fmt: skip

    @property
    def num_steps(self) -> int:
        """Steps ``T`` of the schedule."""
        return len(self.sde_types)

    @property
    def done(self) -> bool:
        """True after the last step."""
        return self.step_index == self.num_steps

    @property
    def sigma(self) -> torch.Tensor:
        """``(N,)`` the current noise level."""
        return self.sigmas[:, self.step_index]

    def advance(self, velocity: torch.Tensor) -> sde.SDEStepOutput:
        """Apply the current step's SDE to the latents with ``velocity`` (float32, validated by the caller), record
        the transition, and return it."""
        index = self.step_index
        if self.branching is not None:  # a node moves with its first lane's velocity (one prediction per node)
            velocity = velocity[self.branching.representatives(self.branching.level(index - 1)).to(velocity.device)]
        with torch.no_grad():  # the rollout is data; learners recompute log-probs with gradients
            out = sde.step(
                self.sde_types[index],
                self.latents,
                velocity,
                self.sigmas[:, index],
                self.sigmas[:, index + 1],
                self.eta,
                generator=self.generators,
                log_prob_kind=self.log_prob_kind,
            )
        if self._multistep:
            out = self._with_multistep_correction(out, velocity, index)
        if self.branching is not None:  # each node after this step takes its first lane's transition
            out = _select_lanes(out, self.branching.representatives(self.branching.level(index)))
        self.recorder.record(out)
        self.latents, self.step_index = out.x_next, index + 1
        return out

    def _with_multistep_correction(
        self, out: sde.SDEStepOutput, velocity: torch.Tensor, index: int
    ) -> sde.SDEStepOutput:
        """Keep this step's data prediction ``x - sigma v``; on a second-order step add DPM-Solver++'s correction."""
        sigma = self.sigmas[:, index]
        prediction = self.latents.float() - per_sample(sigma, self.latents) * velocity.float()
        previous, self._previous_prediction = self._previous_prediction, (prediction, sigma)
        if index not in self._second_order or previous is None:
            return out
        correction = sde.dpm_solver_2m_correction(
            prediction, previous[0], previous[1], sigma, self.sigmas[:, index + 1]
        )
        return sde.SDEStepOutput(
            x_next=out.x_next + correction,
            mean=out.mean + correction,
            std=out.std,
            log_prob=out.log_prob,
            trainable=out.trainable,
        )

    def finish(self, reward: CompositeReward | None = None, fps: float | None = None) -> Trajectory:
        """Decode the final latents and, with a ``reward``, score them: the recorded `Trajectory` (its ``rewards``
        None without a reward)."""
        if not self.done:
            raise RuntimeError(
                f"The batch is at step {self.step_index} of {self.num_steps}; advance it to the end."
            )
        with torch.no_grad():
            videos = self.backbone.decode(self.latents)
        rewards = reward(videos, self.prompts, fps=fps) if reward is not None else None
        return self.recorder.finish(rewards, videos)


def _select_lanes(out: sde.SDEStepOutput, lanes: torch.Tensor) -> sde.SDEStepOutput:
    lanes = lanes.to(out.x_next.device)
    return sde.SDEStepOutput(
        x_next=out.x_next[lanes],
        mean=out.mean[lanes],
        std=out.std[lanes],
        log_prob=out.log_prob[lanes],
        trainable=out.trainable[lanes],
    )


def sample(
    backbone: VideoBackbone,
    prompts: Sequence[str],
    seeds: Sequence[int],
    sampling: SamplingDefaults | None = None,
    *,
    sde_type: str = "ode",
    eta: float = 0.0,
    sde_window: tuple[int, int] | None = None,
    negative_prompt: str | None = None,
    reward: CompositeReward | None = None,
) -> Trajectory:
    """Sample one video per (prompt, seed) from ``backbone`` itself, as `sage_env.DenoisingVectorEnv` rolls out
    with a `sage_env.env.BackbonePolicy` (same seeds, same schedule, same steps: the same videos).

    Args:
        sampling: size, steps, schedule shift, guidance and frame rate; each unset one (None) is the backbone's
            declared default (`sage_env.models.SamplingDefaults`); None: all of them.
        sde_type, eta: the SDE of the stochastic steps (``"ode"``: deterministic Euler sampling).
        sde_window: ``(start, end)``: only these steps use ``sde_type``; all when None.
        negative_prompt: the negative prompt of CFG (the backbone's when None).
        reward: scores the videos (``trajectory.rewards``); None: not scored.

    Returns:
        The recorded `Trajectory`; ``trajectory.videos`` are ``(B, F, 3, H, W)`` float32 in [0, 1].
    """
    if isinstance(prompts, str) or len(prompts) != len(seeds):
        raise ValueError(
            f"Pass a list of prompts and one seed per prompt, got {len(prompts)} and {len(seeds)}."
        )
    settings = (sampling or backbone.sampling_defaults).filled_from(backbone.sampling_defaults)
    sde.validate_sde_type(sde_type)
    sde.validate_eta(sde_type, eta)
    sigmas = backbone.sigmas(settings.num_steps, settings.shift).cpu()
    types = step_sde_types(sde_type, settings.num_steps, sde_window)
    shape = tuple(backbone.latent_shape(settings.num_frames, settings.height, settings.width))
    batch = DenoisingBatch(
        backbone, tuple(prompts), 1, torch.as_tensor(list(seeds), dtype=torch.long), sigmas, types, float(eta),
        "gaussian", shape, backbone.device,
    )  # fmt: skip
    conditioning = backbone.encode_prompts(list(prompts), negative_prompt)
    with torch.no_grad():
        while not batch.done:
            batch.advance(
                backbone.predict_velocity(batch.latents, batch.sigma, conditioning, settings.guidance_scale)
            )
    return batch.finish(reward, settings.fps)


def sample_videos(
    backbone: VideoBackbone,
    prompts: Sequence[str],
    seeds: Sequence[int],
    sampling: SamplingDefaults | None = None,
    **options: object,
) -> torch.Tensor:
    """The videos of `sample` (same arguments, no reward): ``(B, F, 3, H, W)`` float32 in [0, 1]."""
    return sample(backbone, prompts, seeds, sampling, **options).videos
