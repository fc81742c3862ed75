"""Task configs as data (`config_io`): overrides, safe JSON load and save, and the comparison of a
config with a job dir's run. Below the trainer, which reads and writes a job dir's config."""
