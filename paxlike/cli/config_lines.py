"""Comment lines about a task that `--mode=print_config` prints and a run records in
config.txt: the model's size, FLOPs and attention kernel, and the packing efficiency."""

from __future__ import annotations

from typing import Any

from paxlike.errors import UserError
from paxlike.trainer.task import Task
from paxlike.families import family_of


def model_summary(task: Task) -> str:
  """The family's `# params: ...`, FLOPs and attention-kernel lines for `--mode=print_config`;
  a model config its layers reject (at trace time) is a UserError, as in training."""
  try:
    return family_of(task.model).summary(task.model, task.data)
  except (ValueError, TypeError) as error:
    raise UserError(f'invalid model config: {str(error).splitlines()[0]}') from None


def packing_line(data: Any) -> str:
  """'# packing efficiency: ...' (the non-pad fraction of the training targets) for packed
  data (preference pairs: their counts, `pairs_line`), else ''."""
  if callable(getattr(data, 'pairs_line', None)):
    return data.pairs_line()
  if callable(getattr(data, 'prompts_line', None)):  # GRPO's prompts: kept, held out, left out.
    return data.prompts_line()
  packed = getattr(data, 'packed', None)
  if packed is None:
    return ''
  meta = packed.meta
  line = (f"# packing efficiency: {meta['packing_efficiency']:.4f} train, "
          f"{meta['eval_packing_efficiency']:.4f} eval ({meta['train_documents']:,} and "
          f"{meta['eval_documents']:,} documents)\n")
  if meta.get('targetless_pieces'):
    line += (f"# {meta['targetless_pieces']:,} pieces of {meta['documents_with_targetless_pieces']:,}"
             f" training documents hold no target (prompt or non-assistant tokens only) and are "
             f"left out: those documents are longer than data.seq_len, so their targets see only "
             f"the last tokens before them\n")
  if meta.get('targetless_documents'):
    line += (f"# {meta['targetless_documents']:,} training documents have no target token at "
             "all and are left out\n")
  return line
