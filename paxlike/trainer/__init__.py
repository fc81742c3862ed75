"""The trainer: a task placed on its mesh (`build`), its state and step (`train_state`), the
loop (`loop`), held-out evaluation, checkpoints, summaries and the job dir."""
