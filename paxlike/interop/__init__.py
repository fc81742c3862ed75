"""Conversion of checkpoints between paxlike and other frameworks' formats."""

from paxlike.interop.hf_llama import (
    config_from_hf,
    config_to_hf,
    export_params,
    import_params,
    load_hf_checkpoint,
    save_hf_checkpoint,
)

__all__ = [
    'config_from_hf',
    'config_to_hf',
    'export_params',
    'import_params',
    'load_hf_checkpoint',
    'save_hf_checkpoint',
]
