"""What the command line needs besides `paxlike.main`: the run's config and job dir chosen
(`run_config`), print_config's lines (`config_lines`) and `--mode=decode`'s text
(`decode_text`). Configs themselves are read and written by `paxlike.config`."""
