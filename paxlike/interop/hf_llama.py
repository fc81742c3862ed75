"""python -m paxlike.interop.hf_llama --job_log_dir=DIR --out=HF_DIR [--step=N]: the export's
original name, kept as an alias of `python -m paxlike.interop.hf` (every family, as itself).
Importing it gives the shared checkpoint functions under their old names."""

from paxlike.cli import hf_export
from paxlike.interop.checkpoint import (  # noqa: F401 (the old import path's names)
    check_shapes,
    config_from_hf,
    config_to_hf,
    export_params,
    import_params,
    load_hf_checkpoint,
    name_map,
    read_safetensors,
    safetensors_header,
    save_hf_checkpoint,
)

if __name__ == '__main__':
  hf_export.run_cli()
