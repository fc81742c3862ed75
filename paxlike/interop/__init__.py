"""Hugging Face checkpoints: one module per `model_type` (see `families`), one loading and one
export path for all of them (`checkpoint`). A job's export is the command
`python -m paxlike.interop.hf` (`hf`; `hf_llama` its old name), which runs
`paxlike.cli.hf_export`: it restores the job through the trainer, which sits above this package."""

from paxlike.interop.checkpoint import (
    config_from_hf,
    config_to_hf,
    export_params,
    import_params,
    load_hf_checkpoint,
    name_map,
    read_safetensors,
    save_hf_checkpoint,
)
from paxlike.interop.families import FAMILIES, family_for_config, family_for_model

__all__ = [
    'FAMILIES',
    'config_from_hf',
    'config_to_hf',
    'export_params',
    'family_for_config',
    'family_for_model',
    'import_params',
    'load_hf_checkpoint',
    'name_map',
    'read_safetensors',
    'save_hf_checkpoint',
]
