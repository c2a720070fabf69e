"""Full-size pipelines from configuration files alone: where the configs come from, and the fake-tensor build.

`resolve_model_configs` finds a pipeline's ``model_index.json`` and every component's config, in this order:
a local diffusers folder, the Hugging Face cache (``huggingface_hub.try_to_load_from_cache``: no download), the
configs shipped in ``sage_trl/preflight/configs`` (sources in its README). `build_pipeline`, called inside
`sage_trl.preflight.tracing.trace_session`, instantiates every component with the diffusers / transformers
class the ``model_index.json`` names, from its config, in the run's dtype: the same modules a
``from_pretrained`` would give, with fake weights. Tokenizers are not built (their files are data, not
configuration): `PaddedTokenizer` stands in for them and returns what the pipelines' ``encode_prompt`` asks for
(``padding="max_length"``), so the pipelines' own encoding code runs unchanged.
"""

from __future__ import annotations

import importlib
import inspect
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "SHIPPED_CONFIGS",
    "ModelConfigs",
    "PaddedTokenizer",
    "build_component",
    "build_pipeline",
    "resolve_model_configs",
    "resolve_transformers_config",
    "shipped_config",
]

SHIPPED_CONFIGS = Path(__file__).with_name("configs")
"""Folder of the configs shipped with the package (one JSON file per pipeline, named ``owner--name.json``)."""

_CONFIG_FILES = {"scheduler": "scheduler_config.json", "guider": "guider_config.json"}
PROMPT_TOKENS = 100
"""Tokens of a typical prompt (the attention masks' valid length). Memory does not depend on it: the
pipelines pad every prompt to a fixed length, and HunyuanVideo 1.5 reorders, never drops, its tokens."""


@dataclass(frozen=True)
class ModelConfigs:
    """The configuration files of one pipeline.

    Args:
        name: the model id or folder the configs belong to.
        source: where they were read (a folder, the Hugging Face cache, or the shipped configs).
        components: ``model_index`` (the pipeline's ``model_index.json``) and one config dict per component folder.
    """

    name: str
    source: str
    components: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def pipeline_class(self) -> str:
        """``_class_name`` of ``model_index.json`` (e.g. ``WanPipeline``)."""
        return self.components["model_index"]["_class_name"]


def shipped_config(repo_id: str) -> dict[str, Any] | None:
    """The shipped config bundle of a Hub id (``owner/name``), or None."""
    path = SHIPPED_CONFIGS / f"{repo_id.replace('/', '--')}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _component_names(model_index: dict[str, Any]) -> list[str]:
    return [name for name, entry in model_index.items() if isinstance(entry, list) and len(entry) == 2]


def _read_folder(read: Callable[[str], str | None]) -> dict[str, dict[str, Any]] | None:
    """Configs through ``read(relative path) -> text | None``; None when there is no ``model_index.json``."""
    index_text = read("model_index.json")
    if index_text is None:
        return None
    components: dict[str, dict[str, Any]] = {"model_index": json.loads(index_text)}
    for component in _component_names(components["model_index"]):
        text = read(f"{component}/{_CONFIG_FILES.get(component, 'config.json')}")
        if text is not None:
            components[component] = json.loads(text)
    return components


def _from_cache_file(repo_id: str, filename: str) -> str | None:
    """A file of a Hub repository from the local Hugging Face cache, without any download; None if absent."""
    from huggingface_hub import try_to_load_from_cache

    try:
        path = try_to_load_from_cache(repo_id, filename)
    except ValueError:  # not a valid repo id
        return None
    return Path(path).read_text() if isinstance(path, str) else None


def _from_cache(repo_id: str) -> dict[str, dict[str, Any]] | None:
    return _read_folder(lambda filename: _from_cache_file(repo_id, filename))


def resolve_model_configs(model: str) -> ModelConfigs:
    """The configs of ``model`` (a diffusers folder or a Hub id) from the folder, the HF cache, or the shipped files."""
    folder = Path(model)
    if folder.is_dir():
        components = _read_folder(
            lambda name: (folder / name).read_text() if (folder / name).is_file() else None
        )
        if components is None:
            raise ValueError(
                f"{model} has no model_index.json; point model_name_or_path to a diffusers pipeline folder."
            )
        return ModelConfigs(model, f"local folder {model}", components)
    cached = _from_cache(model)
    if cached is not None:
        return ModelConfigs(model, "the Hugging Face cache", cached)
    bundle = shipped_config(model)
    if bundle is not None:
        components = {key: value for key, value in bundle.items() if isinstance(value, dict)}
        return ModelConfigs(
            model, "the configs shipped with sage_trl (sage_trl/preflight/configs)", components
        )
    shipped = sorted(path.stem.replace("--", "/") for path in SHIPPED_CONFIGS.glob("*.json"))
    raise ValueError(
        f"No configuration for model_name_or_path={model!r}: it is not a local diffusers folder, not in the Hugging "
        f"Face cache, and not one of the shipped configs ({', '.join(shipped)}). Download its config files once "
        "(huggingface-cli download <id> --include '*.json') or pass a local folder."
    )


def resolve_transformers_config(model: str) -> dict[str, Any]:
    """A transformers model's ``config.json`` (e.g. VideoAlign's Qwen2-VL base) from a folder, the HF cache, or
    the shipped configs."""
    folder = Path(model)
    if (folder / "config.json").is_file():
        return json.loads((folder / "config.json").read_text())
    cached = _from_cache_file(model, "config.json")
    if cached is not None:
        return json.loads(cached)
    bundle = shipped_config(model)
    if bundle is not None and "config" in bundle:
        return bundle["config"]
    raise ValueError(
        f"No config.json for {model!r}: not a local folder, not in the Hugging Face cache, not shipped with sage_trl."
    )


# -- building under fake tensors ---------------------------------------------------------------------


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _keep_in_fp32(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """diffusers' loading rule: with a low-precision ``torch_dtype``, tensors under a module named in the class's
    ``_keep_in_fp32_modules`` stay float32 (``diffusers.models.model_loading_utils.load_model_dict_into_meta``)."""
    keep = getattr(model, "_keep_in_fp32_modules", None)
    if dtype == torch.float32 or not keep:
        return
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_floating_point() and any(module in name.split(".") for module in keep):
            tensor.data = tensor.data.float()


def build_component(library: str, class_name: str, config: dict[str, Any], dtype: torch.dtype) -> Any:
    """One pipeline component from its config: a diffusers model or config object, or a transformers model."""
    cls = getattr(importlib.import_module(library), class_name)
    if library == "transformers":
        import transformers

        model_config = transformers.AutoConfig.for_model(**config)
        with _default_dtype(dtype):
            return cls._from_config(model_config, dtype=dtype).eval().requires_grad_(False)
    if isinstance(cls, type) and issubclass(cls, torch.nn.Module):
        with _default_dtype(dtype):
            model = cls.from_config(config)
        _keep_in_fp32(model, dtype)
        return model.eval()
    return cls.from_config(config)


class PaddedTokenizer:
    """Stands in for a pipeline's tokenizer: every text becomes ``max_length`` token ids (padding, as the pipelines
    ask for), the first `PROMPT_TOKENS` of them valid in the attention mask. Only shapes reach the fake models."""

    def __call__(self, text: str | list[str], max_length: int, **kwargs: Any) -> Any:
        from transformers import BatchEncoding

        texts = [text] if isinstance(text, str) else list(text)
        mask = torch.zeros(len(texts), max_length, dtype=torch.long)
        mask[:, : min(PROMPT_TOKENS, max_length)] = 1
        ids = torch.zeros(len(texts), max_length, dtype=torch.long)
        return BatchEncoding({"input_ids": ids, "attention_mask": mask})

    def apply_chat_template(self, conversations: list, max_length: int, **kwargs: Any) -> Any:
        """The chat-formatted prompts, tokenized (what ``HunyuanVideo15Pipeline`` asks for)."""
        return self(["" for _ in conversations], max_length=max_length)


def build_pipeline(
    configs: ModelConfigs,
    dtype: torch.dtype,
    device_of: Callable[[str], str] | None = None,
    made_on: str | None = None,
) -> Any:
    """The diffusers pipeline of ``configs`` with every component built from its config (call under fake tensors,
    or with ``device_of(component name)`` for random weights made on that device). With ``made_on`` each
    component's random weights are made there and then moved to ``device_of(name)``, one component at a time: the
    host's random number generator takes minutes for Wan 2.2 A14B's two 14B experts (about 13 s per billion bf16
    parameters on a 2-core machine; ``uniform_`` barely uses more threads), a GPU's seconds, and the copy of one
    expert to the host about as long as one way of an expert swap (11-17 s measured on an H200 machine)."""
    import diffusers

    index = configs.components["model_index"]
    pipeline_class = getattr(diffusers, configs.pipeline_class)
    accepted = inspect.signature(pipeline_class.__init__).parameters
    arguments: dict[str, Any] = {}
    for name in _component_names(index):
        library, class_name = index[name]
        if name not in accepted:
            continue
        if name.startswith("tokenizer"):
            arguments[name] = PaddedTokenizer()
        elif library is not None:
            home = device_of(name) if device_of is not None else None
            made_where = made_on or home
            with torch.device(made_where) if made_where is not None else nullcontext():
                arguments[name] = build_component(library, class_name, configs.components.get(name, {}), dtype)
            if home != made_where and isinstance(arguments[name], torch.nn.Module):
                arguments[name].to(home)
    for name, value in index.items():
        if name in accepted and not isinstance(value, list) and not name.startswith("_"):
            arguments[name] = value  # pipeline settings such as Wan 2.2's boundary_ratio
    pipeline = pipeline_class(**arguments)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline
