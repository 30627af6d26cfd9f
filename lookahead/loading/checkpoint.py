"""What a checkpoint's config.json says before any weights load: its own code? a causal LM at all?"""

from __future__ import annotations

from ..errors import ModelLoadError, OptionFix, with_fix

REMOTE_CODE_FIX = OptionFix("trust_remote_code", "trust_remote_code=True to load_model",
                            "if you trust that code (it runs on this machine)")


def read_config_dict(source: str, local_only: bool) -> dict:
    """The raw config.json of a local directory or hub id (only that file is fetched)."""
    from transformers import PretrainedConfig

    config, _ = PretrainedConfig.get_config_dict(source, local_files_only=local_only)
    return config


def check_checkpoint(config: dict, name: str, trust_remote_code: bool) -> None:
    """Raise ModelLoadError for code the user did not trust, or a model that is no causal LM."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = config.get("model_type")
    remote = "AutoModelForCausalLM" in (config.get("auto_map") or {})
    if remote and model_type not in CONFIG_MAPPING_NAMES and not trust_remote_code:
        raise with_fix(ModelLoadError, f"model {name!r} ships its own modelling code (auto_map in its config.json; "
                                       f"model type {model_type!r} is not in transformers {transformers.__version__})",
                       REMOTE_CODE_FIX)
    if model_type in CONFIG_MAPPING_NAMES and model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not remote:
        kind = "an encoder-decoder model" if config.get("is_encoder_decoder") else "not a causal language model"
        raise ModelLoadError(f"model {name!r} (type {model_type!r}) is {kind}: transformers has no "
                             f"AutoModelForCausalLM class for it, and lookahead drives decoder-only causal LMs")
