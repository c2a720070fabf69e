"""Plug-ins from an installed package: an algorithm, an SDE, a reward and a backbone found by name everywhere.

The example package (examples/plugin_package, shown in docs/extending.md) is put into a temporary folder as an
installed distribution (`tests.fixtures.plugin_dist`): nothing imports it by hand. Each user path then finds its
plug-ins by name: ``agents.make``, ``gym.make``, ``sage-train`` (its flags, its --help, the run record and the model
card). The rules of the registry (lazy loading, a broken plug-in reported when asked for, two distributions
claiming one name) are checked on the same kind of distribution.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agents import ALGORITHMS
from sage_env.backbones import BACKBONES
from sage_env.plugins import PluginError
from sage_env.rewards import REWARDS
from sage_env.sde import SDES
from tests.fixtures.plugin_dist import EXAMPLE_PLUGINS, install_distribution
from tests.fixtures.toml import toml_loads

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_distribution(EXAMPLE_PLUGINS, tmp_path_factory.mktemp("site-packages"))


def _environment(plugin_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{plugin_path}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}


def test_each_kind_is_found_by_name_once_installed(
    plugin_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = {"scaled_grpo": ALGORITHMS, "half_dance": SDES, "colourfulness": REWARDS, "fast_toy": BACKBONES}
    assert not any(name in group for name, group in names.items())
    monkeypatch.syspath_prepend(str(plugin_path))
    for name, group in names.items():
        assert name in group.names()
        assert group.load(name) is group.load(name)  # imported once
    assert ALGORITHMS.load("scaled_grpo").config_class().advantage_scale == 1.0
    assert "sage_example_plugins" in sys.modules


def _broken_distribution(target: Path, name: str, module: str) -> Path:
    package = target / module
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        "raise ImportError('this plug-in needs a library you do not have')\n"
    )
    dist_info = target / f"{module}-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text(f"[sage_grpo.sdes]\n{name} = {module}:Unit\n")
    return target


def test_a_broken_plugin_is_reported_only_when_asked_for(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(_broken_distribution(tmp_path, "broken_sde", "broken_sde_dist")))
    assert "broken_sde" in SDES.names()
    from sage_env import sde

    assert "sage" in sde.stochastic_sde_types() and "broken_sde" not in sde.stochastic_sde_types()
    with pytest.raises(
        PluginError, match=r"'broken_sde' could not be loaded .*broken_sde_dist 0\.1.*do not have"
    ):
        sde.get_sde("broken_sde")


def test_two_distributions_claiming_one_name_is_an_error_naming_both(tmp_path: Path, monkeypatch) -> None:
    for index in (1, 2):
        _broken_distribution(tmp_path / f"site{index}", "twin_sde", f"twin_dist_{index}")
        monkeypatch.syspath_prepend(str(tmp_path / f"site{index}"))
    with pytest.raises(
        PluginError, match=r"declared by 2 installed distributions \(twin_dist_1 0\.1, twin_dist_2 0\.1\)"
    ):
        SDES.load("twin_sde")


GYM_SCRIPT = textwrap.dedent(
    """
    import gymnasium as gym, torch, agents, sage_env
    env = gym.make("sage_env/fast_toy-v0", backbone="toy", reward_fn="colourfulness", sde="half_dance", eta=0.8)
    assert env.unwrapped._vector.num_steps == 4  # the plug-in backbone's own defaults
    agent = agents.make("scaled_grpo", env=env, advantage_scale=2.0, learning_rate=1e-2)
    assert (agent.config.sde, agent.config.advantage_scale, agent.config.kl_strategy) == ("half_dance", 2.0, "moving")
    before = [p.detach().clone() for p in agent.parameters]
    episodes = []
    for seed in range(3):
        observation, _ = env.reset(seed=seed, options={"prompt": "a red square moving left"})
        done = False
        while not done:
            observation, _, terminated, truncated, _ = env.step(agent.act(observation))
            done = terminated or truncated
        episodes.append(env.unwrapped.trajectory)
    agent.update(episodes)
    print("trained", any(not torch.equal(a, b) for a, b in zip(before, agent.parameters)))
    """
)


@pytest.mark.slow
def test_agents_make_and_gym_make_find_every_kind(plugin_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", GYM_SCRIPT], env=_environment(plugin_path), capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trained True" in done.stdout


def test_sage_train_runs_the_plugins_and_records_them(plugin_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    command = [
        "sage-train", "--output_dir", str(out), "--algorithm", "scaled_grpo", "--advantage_scale", "2",
        "--sde", "half_dance", "--eta", "0.8", "--reward", "colourfulness", "--backbone", "fast_toy", "--sde_window", "0", "2",
        "--max_steps", "1", "--per_device_train_batch_size", "4", "--num_generations", "2",
        "--gradient_accumulation_steps", "1", "--num_eval_prompts", "1", "--eval_seeds", "0",
        "--save_strategy", "no",
    ]  # fmt: skip
    environment = _environment(plugin_path)
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    config = json.loads((out / "sage_config.json").read_text())
    assert (config["algorithm"], config["sde"], config["algorithm_args"]) == ("scaled_grpo", "half_dance",
                                                                               {"advantage_scale": 2.0})  # fmt: skip
    assert config["num_inference_steps"] == 4 and config["run"]["base_model"]["pipeline_class"] == "fast_toy"
    assert [reward["name"] for reward in config["run"]["rewards"]] == ["colourfulness"]
    assert "advantage_scale: 2.0" in (out / "run_config.yaml").read_text()
    card_dir = tmp_path / "card"
    push = ["sage-push", str(out), "--repo-id", "me/plugins", "--license", "mit", "--dry-run", str(card_dir)]
    assert subprocess.run(push, env=environment, capture_output=True, text=True, check=False).returncode == 0
    card = (card_dir / "README.md").read_text()
    for named in ("Scaled-GRPO", "half_dance", "colourfulness", "advantage_scale"):
        assert named in card, named


def test_sage_train_help_lists_the_algorithms_own_fields(plugin_path: Path) -> None:
    done = subprocess.run(["sage-train", "--algorithm", "scaled_grpo", "--help"], env=_environment(plugin_path),
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--advantage_scale" in done.stdout and "Multiplies every advantage" in done.stdout


def test_the_docs_show_the_example_packages_own_entry_points() -> None:
    from tests.test_docs import ALL_BLOCKS

    shown = [b for b in ALL_BLOCKS if b.path.name == "extending.md" and b.language == "toml"]
    declared = toml_loads((EXAMPLE_PLUGINS / "pyproject.toml").read_text())["project"]["entry-points"]
    assert len(shown) == 1 and toml_loads(shown[0].code)["project"]["entry-points"] == declared
