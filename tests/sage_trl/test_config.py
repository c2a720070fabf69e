"""Each hyperparameter is declared once: the trainer's algorithm fields are generated from the agents' config."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from agents import ALGORITHM_CONFIGS, AlgorithmConfig
from agents.config import AGENT_ONLY_FIELDS
from sage_trl import SageGRPOConfig
from sage_trl.config import ALGORITHM_FIELDS, SageGRPOFields

ROOT = Path(__file__).resolve().parents[2]
BASE = {f.name: f for f in dataclasses.fields(AlgorithmConfig)}


def test_every_algorithm_field_is_generated_with_the_single_help_text() -> None:
    trainer = {f.name: f for f in dataclasses.fields(SageGRPOConfig)}
    assert set(ALGORITHM_FIELDS) == set(BASE) - set(AGENT_ONLY_FIELDS)
    for name in ALGORITHM_FIELDS:
        assert trainer[name].default is None  # None: the chosen algorithm's (or the model's) default
        assert trainer[name].metadata["help"].startswith(BASE[name].metadata["help"])
        assert "Default:" in trainer[name].metadata["help"]


def test_no_declaration_is_repeated() -> None:
    tree = ast.parse((ROOT / "sage_trl" / "config.py").read_text())
    fields_class = next(
        n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "SageGRPOFields"
    )
    declared = {node.target.id for node in fields_class.body if isinstance(node, ast.AnnAssign)}
    assert not declared & set(BASE), "an algorithm field is declared in sage_trl/config.py"
    for name, config_class in ALGORITHM_CONFIGS.items():
        for field in dataclasses.fields(config_class):
            if field.name in BASE:  # subclasses change defaults only, never the meaning or its text
                assert not field.metadata or field.metadata is BASE[field.name].metadata, (name, field.name)


def test_every_field_has_a_help_string() -> None:
    for field in dataclasses.fields(SageGRPOFields):
        if field.name in {f.name for f in dataclasses.fields(SageGRPOFields.__mro__[1])}:
            continue  # GRPOConfig's own fields keep TRL's texts
        assert field.metadata.get("help"), field.name
    for field in dataclasses.fields(AlgorithmConfig):
        assert len(field.metadata["help"]) > 20, field.name


@pytest.mark.parametrize("algorithm", sorted(ALGORITHM_CONFIGS))
def test_the_trainer_resolves_each_algorithm_to_its_own_defaults(algorithm: str, tmp_path: Path) -> None:
    config = SageGRPOConfig(output_dir=str(tmp_path), use_cpu=True, algorithm=algorithm)
    defaults = ALGORITHM_CONFIGS[algorithm]()
    resolved = config.algorithm_config()
    for name in ALGORITHM_FIELDS:
        if name != "guidance_scale":  # the model's (the toy's 1.0), not the algorithm's
            assert getattr(resolved, name) == getattr(defaults, name), name


def test_the_toy_preset_trains_what_the_toy_environment_explores(tmp_path: Path) -> None:
    """`sage-train` on the toy and ``gym.make("sage_env/Toy-v0")`` sample with the same SDE settings and schedule."""
    from sage_env.toy.env import TOY_ENV_DEFAULTS

    config = SageGRPOConfig.from_preset("toy", output_dir=str(tmp_path / "run"))
    assert config.sde == TOY_ENV_DEFAULTS["sde"] and config.eta == TOY_ENV_DEFAULTS["eta"]
    assert tuple(config.sde_window) == tuple(TOY_ENV_DEFAULTS["sde_window"])
    settings = {name: TOY_ENV_DEFAULTS[name] for name in ("num_frames", "height", "width", "shift")}
    assert {name: getattr(config, name) for name in settings} == settings
    assert config.num_inference_steps == TOY_ENV_DEFAULTS["num_steps"]
