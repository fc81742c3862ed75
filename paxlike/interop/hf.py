"""python -m paxlike.interop.hf --job_log_dir=DIR --out=HF_DIR [--step=N]: export a job's
checkpoint as a Hugging Face directory of the family it came from (`paxlike.cli.hf_export`)."""

from paxlike.cli import hf_export

if __name__ == '__main__':
  hf_export.run_cli()
