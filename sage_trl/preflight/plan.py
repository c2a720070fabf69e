"""The preflight's result: resident memory by kind, the peak of each phase per process, FLOPs and time, as text.

Traced numbers are per process of a single-GPU layout. `PreflightPlan.for_world` turns them into another world
size: with DDP every process holds the same state plus gradient buckets (one fp32 copy of the trainable
gradients: PyTorch DDP's buckets, separate from ``.grad`` unless ``gradient_as_bucket_view``); with FSDP2 the
transformer's weights, gradients, optimizer state and anchor are sharded over the processes and each process
gathers at most two transformer blocks at a time (the one computing and the one prefetched). The world-size
arithmetic is stated in the output; the single-process numbers are traced.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from sage_trl.preflight.gpus import DEFAULT_UTILISATION, GpuSpec

__all__ = [
    "ALLOCATOR_HINT",
    "LIMITS",
    "MARGIN_FRACTION",
    "MARGIN_GIB",
    "TIGHT_FIT_HEADROOM",
    "MemoryKind",
    "PhasePlan",
    "PreflightPlan",
    "gib",
]

GIB = 2**30
MARGIN_GIB = 1.0
"""CUDA context and library handles (cuBLAS, cuDNN workspaces), per process."""
MARGIN_FRACTION = 0.10
"""The caching allocator's fragmentation and rounding, and kernel workspaces, as a fraction of the peak."""
TIGHT_FIT_HEADROOM = 0.15
"""A plan that fits with less headroom than this (the card's GiB / (peak + margins) - 1) gets the allocator hint:
the fragmentation margin (`MARGIN_FRACTION`) is not always enough. Measured on an H200 on 2026-11-27
(docs/training_on_gpus.md), the 16 GB Wan config's rollout reserved 38% above its peak with PyTorch's default
allocator and ran out of memory at its plan's 13.1 GiB; with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``
it ran there."""
ALLOCATOR_HINT = (
    "Tight: launch with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the default allocator's fragmentation "
    f"can exceed the {MARGIN_FRACTION:.0%} margin this close to the card; measured on the 16 GB Wan config)."
)
LIMITS = (
    "What a trace cannot see, and the margin the fit check adds for it: the CUDA context and library handles "
    f"(~{MARGIN_GIB:g} GiB per process); the caching allocator's fragmentation and block rounding, and kernel "
    "workspaces (cuBLAS and cuDNN scratch space, e.g. the VAE's 3D convolutions), which are not tensors "
    f"(~{MARGIN_FRACTION:.0%} of the peak); NCCL's buffers with more than one process (a few hundred MiB, not "
    "added). Attention is traced with PyTorch's fused CPU kernel, which like FlashAttention never materialises "
    "the N x N scores; autocast follows the CPU rules (bf16 matmuls, as on CUDA). VideoAlign's scoring forward is "
    "not traced (its weights are counted)."
)
_SHARDED_KINDS = ("transformer weights", "trainable parameters", "optimizer state", "moving anchor")


def gib(num_bytes: float) -> str:
    """``12.3 GiB``."""
    return f"{num_bytes / GIB:.1f} GiB"


@dataclass(frozen=True)
class MemoryKind:
    """Bytes of one kind of resident state; ``on_device`` False for state kept on the host (offloaded)."""

    name: str
    num_bytes: int
    on_device: bool = True


@dataclass(frozen=True)
class PhasePlan:
    """One traced phase of a training step on one process.

    Args:
        name: ``encode prompts``, ``rollout step``, ``decode``, ``training micro-step``, ``optimizer step``.
        start_bytes: device bytes alive when the phase starts.
        peak_bytes: the phase's device peak.
        flops: FLOPs of the phase as traced (``FlopCounterMode``).
        per_optimizer_step: how many times the phase runs per optimizer step on one process.
        uses_transformer: whether the transformer computes in the phase (FSDP gathers blocks then).
        gradient_bytes: accumulated gradients alive during the phase (sharded by FSDP like the parameters).
        note: what the phase covers.
        total_transient_bytes: the phase's peak above its start of device and host memory together: what one
            allocator would see if both were one (a CPU run); above ``peak_bytes - start_bytes`` by the host copies
            the phase holds at that moment (``activation_offload``).
    """

    name: str
    start_bytes: int
    peak_bytes: int
    flops: int
    per_optimizer_step: float
    uses_transformer: bool
    gradient_bytes: int = 0
    note: str = ""
    total_transient_bytes: int = 0

    @property
    def before_wrapping(self) -> bool:
        """A one-time phase (``per_optimizer_step`` 0: the prompt precomputation), which runs before the trainable
        state and the distributed wrapper exist: DDP's buckets and FSDP's shards do not change it."""
        return self.per_optimizer_step == 0


@dataclass
class PreflightPlan:
    """Memory and compute of one training config on one process (see the module docstring)."""

    model: str
    config_source: str
    setting: str
    kinds: list[MemoryKind]
    phases: list[PhasePlan]
    largest_block_bytes: int
    lora: bool = True
    world_size: int = 1
    fsdp: bool = False
    gpu: GpuSpec | None = None
    utilisation: float = DEFAULT_UTILISATION
    memory_budget_gib: float | None = None
    savers: list[str] | None = None
    """Savers that were switched on to fit the budget (None: not searched)."""
    saver_costs: list[str] | None = None
    """What each of `savers` costs (`sage_trl.preflight.savers.Saver.cost`)."""
    saver_peak_bytes: int | None = None
    trace_seconds: float = 0.0
    phase_seconds: dict[str, float] = field(default_factory=dict)
    expert_swaps: int = 0
    """Swaps of the idle Wan 2.2 expert per optimizer step (``offload_idle_expert``), 0 without."""
    expert_swap_bytes: int = 0
    """Bytes one swap moves each way (one expert's frozen weights out, the other's in)."""

    # -- numbers -------------------------------------------------------------------------------------

    @property
    def peak_bytes(self) -> int:
        """The largest phase peak: what ``torch.cuda.max_memory_allocated`` would report over a step."""
        return max(phase.peak_bytes for phase in self.phases)

    @property
    def peak_phase(self) -> PhasePlan:
        """The phase with the largest peak."""
        return max(self.phases, key=lambda phase: phase.peak_bytes)

    def required_gib(self, peak_bytes: int | None = None) -> float:
        """Peak plus the margins of `LIMITS`: what the GPU must have."""
        peak = self.peak_bytes if peak_bytes is None else peak_bytes
        return peak * (1 + MARGIN_FRACTION) / GIB + MARGIN_GIB

    @property
    def budget_gib(self) -> float | None:
        """The memory budget: ``--gpu_memory_gib``, else the GPU's capacity, else None."""
        if self.memory_budget_gib is not None:
            return self.memory_budget_gib
        return self.gpu.memory_gib if self.gpu is not None and self.gpu.memory_gib > 0 else None

    @property
    def fits(self) -> bool | None:
        """Whether the required memory fits the budget (None without a budget)."""
        budget = self.budget_gib
        return None if budget is None else self.required_gib() <= budget

    @property
    def flops_per_optimizer_step(self) -> float:
        """FLOPs of one process per optimizer step (rollouts and training)."""
        return sum(phase.flops * phase.per_optimizer_step for phase in self.phases)

    def seconds(self, flops: float) -> float | None:
        """Seconds for ``flops`` at the GPU's throughput times `utilisation` (None without a GPU)."""
        if self.gpu is None:
            return None
        return flops / (self.gpu.bf16_tflops * 1e12 * self.utilisation)

    # -- other world sizes ---------------------------------------------------------------------------

    def for_world(self, world_size: int, fsdp: bool) -> PreflightPlan:
        """This single-process plan for ``world_size`` processes with DDP (``fsdp`` False) or FSDP2."""
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}.")
        if world_size == 1:
            return replace(self, world_size=1, fsdp=False)
        kinds = list(self.kinds)
        if fsdp:
            sharded = sum(k.num_bytes for k in kinds if k.name in _SHARDED_KINDS and k.on_device)
            kinds = [
                replace(k, num_bytes=k.num_bytes // world_size) if k.name in _SHARDED_KINDS else k
                for k in kinds
            ]
            phases = [
                p if p.before_wrapping else _shift(p, self._fsdp_delta(p, sharded + p.gradient_bytes, world_size))
                for p in self.phases
            ]
        else:
            buckets = next((k.num_bytes for k in kinds if k.name == "trainable parameters"), 0)
            kinds.append(MemoryKind("DDP gradient buckets", buckets))
            phases = [p if p.before_wrapping else _shift(p, buckets) for p in self.phases]
        return replace(self, kinds=kinds, phases=phases, world_size=world_size, fsdp=fsdp)

    def _fsdp_delta(self, phase: PhasePlan, sharded: int, world_size: int) -> int:
        """Bytes an FSDP2 process holds less than a single process in ``phase``: all but one shard of the
        sharded state, plus two gathered blocks while the transformer computes."""
        gathered = 2 * self.largest_block_bytes if phase.uses_transformer else 0
        return gathered - (sharded - sharded // world_size)

    # -- text ----------------------------------------------------------------------------------------

    def format(self) -> str:
        """The plan as markdown-like text: resident memory by kind, phases, compute, fit, savers, limits."""
        parts = [
            self._header(),
            self._kinds_table(),
            self._phases_table(),
            self._compute(),
            self._verdict(),
            LIMITS,
        ]
        return "\n\n".join(part for part in parts if part)

    def _header(self) -> str:
        layout = (
            "1 process"
            if self.world_size == 1
            else f"{self.world_size} processes, {'FSDP2' if self.fsdp else 'DDP'}"
        )
        return (
            f"# Preflight: {self.model} ({self.setting})\n\nTraced at full size under fake tensors from {self.config_source} "
            f"in {self.trace_seconds:.0f} s; per process ({layout}). Numbers are traced, not measured on a GPU."
        )

    def _kinds_table(self) -> str:
        rows = [
            f"| {k.name} | {gib(k.num_bytes)} | {'device' if k.on_device else 'host (offloaded)'} |"
            for k in self.kinds
        ]
        return "\n".join(["| resident state | size | where |", "|---|---|---|", *rows])

    def _phases_table(self) -> str:
        rows = [
            f"| {p.name} | {gib(p.start_bytes)} | {gib(p.peak_bytes)} | {p.flops / 1e12:,.1f} | "
            f"{p.per_optimizer_step:g} | {p.note} |"
            if p.per_optimizer_step
            else f"| {p.name} | {gib(p.start_bytes)} | {gib(p.peak_bytes)} | {p.flops / 1e12:,.1f} | once, at the start | {p.note} |"
            for p in self.phases
        ]
        header = "| phase | resident at start | peak | TFLOPs | runs per optimizer step | what runs |"
        return "\n".join([header, "|---|---|---|---|---|---|", *rows])

    def _compute(self) -> str:
        total = self.flops_per_optimizer_step
        line = f"Compute per optimizer step and process: {total / 1e15:,.2f} PFLOPs"
        seconds = self.seconds(total)
        if seconds is None:
            line += " (pass --gpu for a time)."
        else:
            line = (
                f"{line}: {seconds / 60:,.1f} min on one {self.gpu.name} ({self.gpu.bf16_tflops:g} TFLOP/s dense bf16) "
                f"at {self.utilisation:.0%} utilisation (an assumption, not a measurement)."
            )
        if self.expert_swaps:
            line += (
                f"\n\nExpert swaps per optimizer step (offload_idle_expert): {self.expert_swaps}, each moving "
                f"{gib(self.expert_swap_bytes)} to the host and as much back: "
                f"{gib(2 * self.expert_swaps * self.expert_swap_bytes)} over PCIe per step (not in the time above)."
            )
        return line

    def _verdict(self) -> str:
        peak = self.peak_phase
        required = self.required_gib()
        text = f"Peak: {gib(peak.peak_bytes)} in the {peak.name}; with the margins below, {required:.1f} GiB."
        budget = self.budget_gib
        if budget is None:
            return text
        if self.fits:
            tight = budget < required * (1 + TIGHT_FIT_HEADROOM)
            return f"{text} Fits in {budget:g} GiB." + (f" {ALLOCATOR_HINT}" if tight else "")
        text += f" Does NOT fit in {budget:g} GiB."
        if self.savers and self.saver_peak_bytes is not None:
            after = self.required_gib(self.saver_peak_bytes)
            fits = after <= budget
            text += f" With {', '.join(self.savers)}: {after:.1f} GiB, {'fits' if fits else 'still does not fit'}."
            if self.saver_costs:
                costs = "; ".join(f"{name}: {cost}" for name, cost in zip(self.savers, self.saver_costs))
                text += f" What each costs: {costs}."
            if fits:
                return text
        if self.savers is not None:
            lora = "" if self.lora else ", or LoRA"
            text += f" Beyond the savers: shorter videos (num_frames), FSDP2 over more GPUs{lora}."
        return text


def _shift(phase: PhasePlan, delta: int) -> PhasePlan:
    return replace(phase, start_bytes=phase.start_bytes + delta, peak_bytes=phase.peak_bytes + delta)
