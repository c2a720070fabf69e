"""Each hyperparameter is declared once, in a class body: the trainer's config composes the agents' config."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest
from trl import GRPOConfig

from agents import ALGORITHM_CONFIGS, AlgorithmConfig
from sage_trl import SageGRPOConfig
from sage_trl.config import ALGORITHM_FIELDS, SageGRPOFields

ROOT = Path(__file__).resolve().parents[2]
BASE = {f.name: f for f in dataclasses.fields(AlgorithmConfig)}


def _declared_in(config_class: type) -> set[str]:
    """Names annotated in the class body itself (its own declarations)."""
    return set(inspect.get_annotations(config_class))


def test_every_field_is_declared_in_a_class_body_of_this_project_or_of_trl() -> None:
    inspect.getsource(SageGRPOConfig)  # a real class in source, not generated
    owners = [AlgorithmConfig, SageGRPOFields, *GRPOConfig.__mro__]
    for config_field in dataclasses.fields(SageGRPOConfig):
        owner = next(c for c in owners if config_field.name in _declared_in(c))
        assert owner.__module__.split(".")[0] in ("agents", "sage_trl", "trl", "transformers"), (
            config_field.name
        )
    assert not _declared_in(SageGRPOConfig)  # it composes, declaring nothing itself


def test_the_algorithm_fields_are_the_agents_declarations() -> None:
    trainer = {f.name: f for f in dataclasses.fields(SageGRPOConfig)}
    assert set(ALGORITHM_FIELDS) == set(BASE)
    for name in ALGORITHM_FIELDS:
        assert trainer[name] is BASE[name] or trainer[name].metadata is BASE[name].metadata, name
        assert trainer[name].default is None  # None: the chosen algorithm's (or the model's) default
        assert "help" in BASE[name].metadata and "check" in BASE[name].metadata, name


def test_no_declaration_is_repeated() -> None:
    tree = ast.parse((ROOT / "sage_trl" / "config.py").read_text())
    fields_class = next(
        n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "SageGRPOFields"
    )
    declared = {node.target.id for node in fields_class.body if isinstance(node, ast.AnnAssign)}
    assert not declared & set(BASE), "an algorithm field is declared in sage_trl/config.py"
    for name, config_class in ALGORITHM_CONFIGS.items():
        assert not _declared_in(config_class) & set(BASE), name  # algorithms change `defaults`, not fields
        assert set(config_class.defaults) == set(AlgorithmConfig.defaults), name


def test_every_field_has_a_help_string_and_a_check() -> None:
    for field in dataclasses.fields(SageGRPOFields):
        if field.name not in _declared_in(SageGRPOFields):
            continue  # GRPOConfig's own fields keep TRL's texts
        assert field.metadata.get("help"), field.name
    for config_class in ALGORITHM_CONFIGS.values():
        for field in dataclasses.fields(config_class):
            assert len(field.metadata["help"]) > 20, field.name
            assert field.metadata.get("check") is not None, field.name


def test_every_algorithm_default_passes_its_own_check() -> None:
    for name, config_class in ALGORITHM_CONFIGS.items():
        config = config_class()
        for field in dataclasses.fields(config):
            assert getattr(config, field.name) is not None or field.metadata["check"].optional, (
                name,
                field.name,
            )


@pytest.mark.parametrize("algorithm", sorted(ALGORITHM_CONFIGS))
def test_the_trainer_resolves_each_algorithm_to_its_own_defaults(algorithm: str, tmp_path: Path) -> None:
    config = SageGRPOConfig(output_dir=str(tmp_path), use_cpu=True, algorithm=algorithm)
    defaults = ALGORITHM_CONFIGS[algorithm]()
    resolved = config.algorithm_config()
    for name in ALGORITHM_FIELDS:
        if name != "guidance_scale":  # the model's (the toy's 1.0), not the algorithm's
            assert getattr(resolved, name) == getattr(defaults, name), name


def test_the_config_turns_ddp_unused_parameter_search_off_unless_set(tmp_path: Path) -> None:
    """The resolved value is in the config (and so in run_config.yaml), not set later by the trainer: a run's
    recorded settings equal what its flags resolve to (the arena's merge compares them)."""
    assert SageGRPOConfig(output_dir=str(tmp_path), use_cpu=True).ddp_find_unused_parameters is False
    chosen = SageGRPOConfig(output_dir=str(tmp_path), use_cpu=True, ddp_find_unused_parameters=True)
    assert chosen.ddp_find_unused_parameters is True


def test_the_toy_preset_trains_what_the_toy_environment_explores(tmp_path: Path) -> None:
    """`sage-train` on the toy and ``gym.make("sage_env/Toy-v0")`` sample with the same SDE settings and schedule."""
    from sage_env.toy.env import TOY_ENV_DEFAULTS

    config = SageGRPOConfig.from_preset("toy", output_dir=str(tmp_path / "run"))
    assert config.sde == TOY_ENV_DEFAULTS["sde"] and config.eta == TOY_ENV_DEFAULTS["eta"]
    assert tuple(config.sde_window) == tuple(TOY_ENV_DEFAULTS["sde_window"])
    settings = {name: TOY_ENV_DEFAULTS[name] for name in ("num_frames", "height", "width", "shift")}
    assert {name: getattr(config, name) for name in settings} == settings
    assert config.num_inference_steps == TOY_ENV_DEFAULTS["num_steps"]
