"""Multi-process training on CPU: two-process DDP, FSDP2 and DeepSpeed ZeRO-2 runs of `SageGRPOTrainer`, killed and
resumed, train and log what one process trains and logs; launches that differ from what they asked for are refused.

The runs (`tests/sage_trl/distributed_run.py`) are launched with ``accelerate launch`` and the shipped accelerate
configs of ``examples/configs/accelerate`` (process count and port overridden, as `launch_multinode.sh` does;
``--mixed_precision no`` because bf16 on CPU would blur the comparison). FSDP2 and DeepSpeed need accelerate's
engine switched on for CPU (`tests.sage_trl.accelerate_on_cpu`). Each launch trains the toy and the tiny Wan with
LoRA and with full fine-tuning, plus the toy with a reward that leaves one process without a pair to train on:
5 steps, a rollout used for 2 steps (``num_iterations``), dual KL with the moving anchor refreshed after steps 2
and 4, a checkpoint at step 3 (mid-rollout), a kill after step 4, a resume, the final model in the diffusers format;
and the toy with DiffusionNFT and AWM (likelihood-free: the old policy, the EMA, is the anchor; AWM on-policy, one pass)
with MixGRPO (its SDE window moving after every optimizer step) and with GRPO-Guard (the rollout's means buffered).

Tolerances. The two-process run computes the same sums in another order and rolls out 4 videos per forward where
one process rolls out 8: float32 rounding (~6e-8 relative) differs. The tiny Wan's videos barely depend on the
noise (rewards within a group spread by ~6e-4), so advantages ``(r - mean) / std`` carry that rounding at ~1e-4
relative. Adam turns rounding in near-zero gradients into whole updates (its step is ``lr * m / (sqrt(v) + eps)``),
hence ``adam_epsilon=1e-3`` in the runs. Measured differences: weights <= 1.2e-7 (toy) and <= 6.1e-6 (Wan) after
5 steps of learning rate 2e-2; the defects this test found that let the runs finish moved them by 4e-3 to 2e-2
(the others crashed or hung). Hence ``WEIGHTS_ATOL`` 2e-5, and metrics within 1e-3 relative or 1e-4 absolute (the
policy loss is analytically 0 on-policy and its value is that rounding). ``ratio_std`` is a statistic per
micro-batch, and micro-batches hold other pairs when the batch is split over processes: it is not compared.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from accelerate.utils import DistributedType
from safetensors.torch import load_file

from sage_trl.distributed import launch_problems, parameters_outside
from sage_trl.run_folder import layout

REPOSITORY = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("distributed_run.py")
CONFIGS = REPOSITORY / "examples" / "configs" / "accelerate"
RUNS = (
    "toy-lora", "toy-full", "wan-lora", "wan-full", "toy-lora-flat",
    "toy-lora-nft", "toy-full-mix", "toy-full-awm", "toy-lora-guard", "toy-lora-branch",
    "toy-full-flash",
)  # fmt: skip
ENGINES = {  # engine: (the shipped accelerate config, the engine accelerate_on_cpu switches on)
    "ddp": ("ddp_8gpu.yaml", None),
    "fsdp2": ("fsdp2_multinode.yaml", "fsdp"),
    "deepspeed": ("deepspeed_zero2.yaml", "deepspeed"),
}
WEIGHTS_ATOL = 2e-5
METRICS_RTOL, METRICS_ATOL = 1e-3, 1e-4
NOT_COMPARED = ("time/", "step_time", "ratio_std")
TIMEOUT = 240  # seconds per launch; a run takes well under a minute (a collective mismatch would hang)


def environment() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_command(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run ``command`` in its own process group; on timeout kill the whole group (the launcher's workers too)."""
    with subprocess.Popen(
        command,
        cwd=cwd,
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            pytest.fail(
                f"{' '.join(command)} ran past {TIMEOUT} s (hung?):\n{stdout[-3000:]}{stderr[-3000:]}"
            )
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def launch(config: str, root: Path, *arguments: str, processes: int = 2) -> subprocess.CompletedProcess:
    """``accelerate launch`` of the run script with a shipped config, on ``processes`` local CPU processes."""
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / config)]
    command += ["--num_machines", "1", "--machine_rank", "0", "--num_processes", str(processes)]
    command += ["--main_process_ip", "127.0.0.1", "--main_process_port", str(free_port())]
    command += ["--mixed_precision", "no", str(SCRIPT), str(root), *arguments]
    return run_command(
        command, REPOSITORY
    )  # the DeepSpeed config names its JSON file relative to the repository


def output(result: subprocess.CompletedProcess) -> str:
    return result.stdout[-4000:] + result.stderr[-6000:]


def metrics(run: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run / layout.METRICS_FILE).read_text().splitlines()]


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    """The saved model: the diffusers LoRA file, or the diffusers transformer folder's weights (and the second
    expert's, prefixed ``2:``, when both Wan 2.2 experts trained)."""
    files = {"": (layout.LORA_WEIGHT_NAME, f"{layout.TRANSFORMER_FOLDER}/diffusion_pytorch_model.safetensors")}
    files["2:"] = (layout.EXPERT_2_LORA_WEIGHT_NAME, f"{layout.EXPERT_2_FOLDER}/diffusion_pytorch_model.safetensors")
    weights = {}
    for prefix, (lora, full) in files.items():
        path = run / lora if (run / lora).is_file() else run / full
        if path.is_file():
            weights |= {prefix + name: value for name, value in load_file(path).items()}
    return weights


def anchor(checkpoint: Path) -> dict[str, torch.Tensor]:
    state = load_file(checkpoint / layout.STATE_TENSORS_FILE)
    return {name: value for name, value in state.items() if name.startswith("anchor.")}


def assert_close_tensors(actual: dict, expected: dict, what: str) -> None:
    assert actual.keys() == expected.keys(), what
    for name, value in expected.items():
        torch.testing.assert_close(actual[name], value, rtol=0, atol=WEIGHTS_ATOL, msg=f"{what}: {name}")


def assert_same_logs(actual: list[dict], expected: list[dict], run: str) -> None:
    assert [r["step"] for r in actual] == [r["step"] for r in expected], run
    for got, want in zip(actual, expected):
        assert got.keys() == want.keys(), (run, got["step"], got.keys() ^ want.keys())
        for name, value in want.items():
            if not name.startswith(NOT_COMPARED):
                assert math.isclose(got[name], value, rel_tol=METRICS_RTOL, abs_tol=METRICS_ATOL), (
                    run,
                    want["step"],
                    name,
                    got[name],
                    value,
                )


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory, tiny_wan_path: Path) -> Path:
    """The runs in one process, uninterrupted: what the multi-process runs must reproduce."""
    root = tmp_path_factory.mktemp("one_process") / "runs"
    command = [sys.executable, str(SCRIPT), str(root), "--runs", ",".join(RUNS)]
    result = run_command([*command, "--pipelines", f"wan={tiny_wan_path}"], root.parent)
    assert result.returncode == 0, output(result)
    return root


@pytest.mark.slow
def test_the_reference_runs_refresh_the_anchor_twice_and_leave_one_process_idle(one_process: Path) -> None:
    logs = metrics(one_process / "toy-full")
    # The anchor equals the policy right after a refresh (after steps 2 and 4), and differs one step later.
    assert [r["kl/position"] == 0 for r in logs] == [True, False, True, False, True]
    flat = [
        r["frac_groups_without_signal"] for r in metrics(one_process / "toy-lora-flat") if "reward/total" in r
    ]
    assert 0.5 in flat  # one of the two groups, i.e. one process's whole share, had no signal


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_two_processes_killed_and_resumed_train_and_log_what_one_process_does(
    engine: str, one_process: Path, tmp_path: Path, tiny_wan_path: Path
) -> None:
    config, engine_on_cpu = ENGINES[engine]
    if engine == "deepspeed":
        pytest.importorskip("deepspeed")
    root = tmp_path / "runs"
    common = ["--runs", ",".join(RUNS), "--pipelines", f"wan={tiny_wan_path}"]
    common += ["--engine-on-cpu", engine_on_cpu] if engine_on_cpu else []
    killed = launch(config, root, *common, "--kill-at", "4")
    assert killed.returncode != 0, output(killed)  # the last run's processes were SIGKILLed
    for run in RUNS:
        assert (root / run / "checkpoint-3").is_dir() and not (root / run / layout.COMPLETE_FILE).exists()
    resumed = launch(config, root, *common, "--resume")
    assert resumed.returncode == 0, output(resumed)
    assert "find_unused_parameters" not in resumed.stderr
    for run in RUNS:
        assert (root / run / layout.COMPLETE_FILE).is_file()
        assert_close_tensors(final_weights(root / run), final_weights(one_process / run), f"{engine} {run}")
        assert_close_tensors(
            anchor(root / run / "checkpoint-3"), anchor(one_process / run / "checkpoint-3"), f"anchor {run}"
        )
        assert_same_logs(metrics(root / run), metrics(one_process / run), f"{engine} {run}")
    # Every process's own atexit handler, registered before the trainer's, ran after the group was destroyed.
    for rank in (0, 1):
        assert json.loads((root / f"exit-{rank}.json").read_text()) == {"process_group_destroyed": True}


@pytest.mark.multiprocess
def test_two_process_fsdp2_saves_what_diffusers_loads(tmp_path: Path, tiny_wan_path: Path) -> None:
    from diffusers import WanPipeline, WanTransformer3DModel

    root = tmp_path / "runs"
    arguments = [
        "--runs",
        "wan-lora,wan-full",
        "--pipelines",
        f"wan={tiny_wan_path}",
        "--engine-on-cpu",
        "fsdp",
    ]
    result = launch(ENGINES["fsdp2"][0], root, *arguments, "--max-steps", "1")
    assert result.returncode == 0, output(result)
    pipe = WanPipeline.from_pretrained(tiny_wan_path)
    pipe.load_lora_weights(root / "wan-lora")
    assert "default_0" in pipe.get_active_adapters()
    transformer = WanTransformer3DModel.from_pretrained(root / "wan-full" / layout.TRANSFORMER_FOLDER)
    trained = final_weights(root / "wan-full")
    for name, value in transformer.state_dict().items():
        assert torch.equal(value, trained[name]), name


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "engine", ["ddp", pytest.param("fsdp2", marks=pytest.mark.slow)]
)
def test_two_expert_wan_trains_in_two_processes_what_one_process_trains(
    engine: str, tmp_path: Path, tiny_wan22_path: Path
) -> None:
    # Each process runs every expert's micro-batches in the same order (FSDP gathers per expert); each expert's loss
    # is the mean over its pairs on all processes.
    config, engine_on_cpu = ENGINES[engine]
    runs = "wan22-lora,wan22-full" if engine == "fsdp2" else "wan22-lora"
    arguments = ["--runs", runs, "--pipelines", f"wan22={tiny_wan22_path}", "--max-steps", "2"]
    alone = run_command([sys.executable, str(SCRIPT), str(tmp_path / "one"), *arguments], tmp_path)
    assert alone.returncode == 0, output(alone)
    two = launch(config, tmp_path / "two", *arguments, *(["--engine-on-cpu", engine_on_cpu] if engine_on_cpu else []))
    assert two.returncode == 0, output(two)
    for run in runs.split(","):
        expected = final_weights(tmp_path / "one" / run)
        assert any(name.startswith("2:") for name in expected) and any(not n.startswith("2:") for n in expected)
        assert_close_tensors(final_weights(tmp_path / "two" / run), expected, f"{engine} {run}")
        assert_same_logs(metrics(tmp_path / "two" / run), metrics(tmp_path / "one" / run), f"{engine} {run}")


@pytest.mark.multiprocess
@pytest.mark.slow
def test_sequential_cfg_under_fsdp2_trains_what_one_process_trains(tmp_path: Path, tiny_wan_path: Path) -> None:
    # Each CFG branch is checkpointed as a whole: its recomputation in the backward gathers the blocks again.
    arguments = ["--runs", "wan-lora-seq", "--pipelines", f"wan={tiny_wan_path}", "--max-steps", "2"]
    alone = run_command([sys.executable, str(SCRIPT), str(tmp_path / "one"), *arguments], tmp_path)
    assert alone.returncode == 0, output(alone)
    two = launch(ENGINES["fsdp2"][0], tmp_path / "two", *arguments, "--engine-on-cpu", "fsdp")
    assert two.returncode == 0, output(two)
    expected = final_weights(tmp_path / "one" / "wan-lora-seq")
    assert_close_tensors(final_weights(tmp_path / "two" / "wan-lora-seq"), expected, "fsdp2 sequential_cfg")
    assert_same_logs(metrics(tmp_path / "two" / "wan-lora-seq"), metrics(tmp_path / "one" / "wan-lora-seq"), "seq")


@pytest.mark.multiprocess
def test_ddp_trains_a_model_with_parameters_its_forward_does_not_use(
    tmp_path: Path, tiny_hunyuan_path: Path
) -> None:
    # HunyuanVideo 1.5's last block computes a text-stream output the model discards: its LoRA gets no gradient.
    root = tmp_path / "runs"
    arguments = ["--runs", "hunyuan-lora", "--pipelines", f"hunyuan={tiny_hunyuan_path}", "--max-steps", "1"]
    result = launch(ENGINES["ddp"][0], root, *arguments)
    assert result.returncode == 0, output(result)
    assert "find_unused_parameters" not in result.stderr
    assert (root / "hunyuan-lora" / layout.COMPLETE_FILE).is_file()


@pytest.mark.multiprocess
def test_a_cpu_launch_of_two_processes_that_runs_one_is_refused(tmp_path: Path) -> None:
    # accelerate's CPU launcher starts one process for --num_processes 2, which would train on half the batch.
    root = tmp_path / "runs"
    command = [sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "2"]
    result = run_command([*command, str(SCRIPT), str(root), "--runs", "toy-lora"], tmp_path)
    assert result.returncode != 0
    assert "LaunchError" in result.stderr and "started this one alone" in result.stderr
    assert not any(
        (root / "toy-lora").iterdir()
    )  # refused before anything was written (transformers made it)


# ----------------------------------------------------------------------------------------------
# The launch check and the unused parameters, in this process
# ----------------------------------------------------------------------------------------------

CPU = torch.device("cpu")


def problems(
    environ: dict[str, str], distributed_type=DistributedType.MULTI_CPU, processes=2, **kwargs
) -> str:
    values = {"device": CPU, "device_count": None, **kwargs}
    return " ".join(
        launch_problems(environ, distributed_type=distributed_type, num_processes=processes, **values)
    )


def test_a_launch_that_got_what_it_asked_for_passes() -> None:
    assert problems({"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}) == ""
    assert problems({}, DistributedType.NO, 1) == ""
    fsdp = {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8", "ACCELERATE_USE_FSDP": "true"}
    cuda = torch.device("cuda", 0)
    assert problems(fsdp, DistributedType.FSDP, 8, device=cuda, device_count=8) == ""


def test_processes_that_each_run_alone_are_refused() -> None:
    # A GPU config on a machine without GPUs: accelerate sets every process up as a single-process run.
    message = problems({"WORLD_SIZE": "2", "LOCAL_RANK": "0"}, DistributedType.NO, 1)
    assert "started 2 processes" in message and "use_cpu: true" in message


def test_accelerates_cpu_launcher_running_one_process_is_refused() -> None:
    message = problems({"ACCELERATE_USE_CPU": "True", "MASTER_ADDR": "127.0.0.1"}, DistributedType.NO, 1)
    assert "started this one alone" in message and "torchrun --nproc_per_node N" in message
    assert problems({"ACCELERATE_USE_CPU": "True"}, DistributedType.NO, 1) == ""  # one process asked for


@pytest.mark.parametrize(
    ("variable", "engine"), [("ACCELERATE_USE_FSDP", "FSDP"), ("ACCELERATE_USE_DEEPSPEED", "DEEPSPEED")]
)
def test_an_engine_accelerate_did_not_switch_on_is_refused(variable: str, engine: str) -> None:
    message = problems({"WORLD_SIZE": "2", variable: "true"})
    assert f"asked for {engine}" in message and "MULTI_CPU on cpu" in message


def test_more_processes_than_gpus_on_a_node_is_refused() -> None:
    environ = {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"}
    message = problems(environ, DistributedType.MULTI_GPU, 8, device=torch.device("cuda", 0), device_count=4)
    assert "8 processes run on this node but it has 4 GPUs" in message


def test_parameters_outside_the_graph_are_found(tiny_hunyuan_backbone) -> None:
    from tests.fixtures.tiny_pipelines import TINY_VIDEO_SIZE

    backbone = tiny_hunyuan_backbone
    transformer = backbone.transformer.requires_grad_(True)
    latents = torch.randn(1, *backbone.latent_shape(*TINY_VIDEO_SIZE.values()))
    velocity = backbone.predict_velocity(
        latents, torch.tensor([0.5]), backbone.encode_prompts(["a cat"], None)
    )
    outside = {id(p) for p in parameters_outside(velocity.sum(), transformer)}
    names = sorted(name for name, p in transformer.named_parameters() if id(p) in outside)
    # The last block's text-stream output: attention output projection and feed-forward, whose output is discarded.
    assert names == sorted(
        f"transformer_blocks.0.{name}.{kind}"
        for name in ("attn.to_add_out", "ff_context.net.0.proj", "ff_context.net.2")
        for kind in ("weight", "bias")
    )
    velocity.sum().backward()
    assert all(p.grad is None for p in transformer.parameters() if id(p) in outside)
    assert all(p.grad is not None for p in transformer.parameters() if id(p) not in outside)


def test_a_step_whose_groups_all_lack_signal_trains_nothing(tmp_path: Path) -> None:
    # The micro-batch every process runs even without a pair (see SageGRPOTrainer.compute_loss) has weight 0.
    from tests.sage_trl.tiny_trainer import make_trainer, named_params

    trainer = make_trainer(tmp_path, reward=lambda videos, prompts, **kwargs: videos.new_zeros(len(videos)))
    trainable = {n for n, p in trainer.backbone.transformer.named_parameters() if p.requires_grad}
    before = named_params(trainer.backbone.transformer)
    trainer.train()
    after = named_params(trainer.backbone.transformer)
    assert all(torch.equal(before[name], after[name]) for name in trainable)
    logged = metrics(tmp_path / "run")
    assert [r["frac_groups_without_signal"] for r in logged] == [1.0, 1.0]
    assert all(r["loss"] == 0 and "policy_loss" not in r for r in logged)
