"""Hugging Face checkpoints: one module per `model_type`, each an `Architecture` record (see
`architectures`), one loading and one export path for all of them (`checkpoint`). A job's
export is the command `python -m paxlike.interop.hf` (`hf_llama` is the same command under the
name DESIGN.md gives it), which runs `paxlike.cli.hf_export`: it restores the job through the
trainer, which sits above this package."""

from paxlike.interop.architectures import (
    ARCHITECTURES,
    architecture_for_config,
    architecture_for_model,
)
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

__all__ = [
    'ARCHITECTURES',
    'architecture_for_config',
    'architecture_for_model',
    'config_from_hf',
    'config_to_hf',
    'export_params',
    'import_params',
    'load_hf_checkpoint',
    'name_map',
    'read_safetensors',
    'save_hf_checkpoint',
]
