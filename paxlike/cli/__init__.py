"""What the command line needs besides `paxlike.main`: the run's config and job dir chosen
(`run_config`), print_config's lines (`config_lines`), `--mode=decode`'s text (`decode_text`) and
the export of a job as a Hugging Face directory (`hf_export`, run as `python -m
paxlike.interop.hf`). Configs themselves are read and written by `paxlike.config`."""
