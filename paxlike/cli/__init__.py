"""The command line, the roof of the house: `paxlike COMMAND` (`dispatch`, its table
`commands`), the job commands train/eval/decode/print_config/list (`job_command`), the flag
groups every program shares (`flag_defs`) and what runs around each program (`program`: the
config from the flags, one-line errors and exit codes). Beside them: the run's config and job
dir chosen (`run_config`), print_config's lines (`config_lines`), decode's text (`decode_text`)
and the export of a job as a Hugging Face directory (`hf_export`, `paxlike hf`). Configs
themselves are read and written by `paxlike.config`."""
