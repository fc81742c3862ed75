"""Packing whole documents into rows of `capacity` = seq_len + 1 tokens: pure numpy functions.

A document is its tokens followed by EOS (SFT: prompt tokens, completion tokens, EOS; chat: the
chat template's tokens, which end each turn themselves). A row's inputs are row[:-1] and its
targets row[1:]. Documents are never cut to fit a row: a document longer than a row is split
into pieces of `capacity` tokens, consecutive pieces sharing one token (the last of one piece
is the first of the next), so every token of a document but its first is a target exactly once
per epoch. The pieces are packed into rows by best-fit
decreasing. Within a row, each piece is its own segment (segment ids 1, 2, ...; 0 = padding)
with positions restarting at 0, and a target is masked when it lies in another segment than its
input, in padding, (SFT) in the prompt, or (chat) outside the assistant's output.

Positions restart per piece, not at the piece's offset in its document: RoPE attention depends
only on relative positions, so nothing is lost inside a row, and positions stay below seq_len,
which a model with an absolute position table (`max_len`) needs.
"""

import bisect
import dataclasses
from collections.abc import Callable

import numpy as np

Batch = dict[str, np.ndarray]

# The version of what a cached packing plan holds (token_store.derived names the cache with
# it): bump it when make_plan, split_documents, best_fit_decreasing, concat_plans or TextData's
# make_packed change the plan they compute, so no run is served a plan of older code.
PLAN_VERSION = 2


@dataclasses.dataclass(frozen=True)
class Plan:
  """Which document pieces fill each row: row r holds pieces row_start[r]:row_start[r + 1],
  in order. Arrays may be read-only memory maps."""

  doc: np.ndarray  # int64 [pieces]: the piece's document.
  offset: np.ndarray  # int64 [pieces]: index of the piece's first token within its document.
  length: np.ndarray  # int64 [pieces]: tokens in the piece.
  row_start: np.ndarray  # int64 [rows + 1].

  @property
  def num_rows(self) -> int:
    return len(self.row_start) - 1


def split_documents(lengths: np.ndarray, capacity: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(doc, offset, length) of the pieces of documents of `lengths` tokens: one piece per
  document of at most `capacity` tokens, else ceil((L - 1) / (capacity - 1)) pieces, each
  starting at the previous piece's last token."""
  if capacity < 2:
    raise ValueError(f'capacity must be >= 2, got {capacity}')
  lengths = np.asarray(lengths, np.int64)
  count = np.maximum(1, -(-(lengths - 1) // (capacity - 1)))
  doc = np.repeat(np.arange(len(lengths), dtype=np.int64), count)
  index = np.arange(len(doc), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
  offset = index * (capacity - 1)
  return doc, offset, np.minimum(capacity, lengths[doc] - offset)


def best_fit_decreasing(lengths: np.ndarray, capacity: int) -> np.ndarray:
  """The row of each item (each length <= capacity) under best-fit decreasing: items longest
  first (ties by index), each into the row with the least room that holds it (ties: the row
  that reached that room first), else into a new row.

  Items of one length are placed in bulk: when the fullest fitting rows have room c, each
  takes c // length items in turn (after its first item it is the fullest fitting row), so
  the cost is O(items) numpy work plus O(distinct lengths + distinct rooms) Python steps.
  """
  lengths = np.asarray(lengths, np.int64)
  if not len(lengths):
    return np.zeros(0, np.int64)
  order = np.argsort(-lengths, kind='stable')
  ordered = lengths[order]
  row = np.empty(len(lengths), np.int64)
  rooms: list[int] = []  # Sorted rooms that some row has.
  rows_with: dict[int, list[int]] = {}  # Room -> the rows with that room, first come first.
  opened = 0
  bounds = [0, *(np.flatnonzero(np.diff(ordered)) + 1).tolist(), len(ordered)]
  for start, stop in zip(bounds[:-1], bounds[1:]):
    size, done = int(ordered[start]), start
    while done < stop:
      j = bisect.bisect_left(rooms, size)
      room = rooms[j] if j < len(rooms) else capacity
      per_row = room // size
      need = -(-(stop - done) // per_row)
      if j < len(rooms):
        queue = rows_with[room]
        targets = np.array(queue[:need], np.int64)
        del queue[:need]
        if not queue:
          del rows_with[room], rooms[j]
      else:
        targets = np.arange(opened, opened + need, dtype=np.int64)
        opened += need
      placed = min(len(targets) * per_row, stop - done)
      row[order[done:done + placed]] = np.repeat(targets, per_row)[:placed]
      filled = np.full(len(targets), per_row)
      filled[-1] = placed - per_row * (len(targets) - 1)
      for target, left in zip(targets.tolist(), (room - filled * size).tolist()):
        if left:
          if left not in rows_with:
            rows_with[left] = []
            bisect.insort(rooms, left)
          rows_with[left].append(target)
      done += placed
  return row


PieceFilter = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def make_plan(lengths: np.ndarray, docs: np.ndarray, capacity: int,
              has_target: PieceFilter | None = None) -> Plan:
  """The packing of documents `docs` (indices into `lengths`, tokens per document).
  `has_target(doc, offset, length)` (SFT, chat) says which pieces hold a scored target; the
  others would only cost compute (a piece attends to itself alone), so they are left out."""
  docs = np.asarray(docs, np.int64)
  piece_doc, offset, length = split_documents(np.asarray(lengths)[docs], capacity)
  if has_target is not None:
    keep = np.asarray(has_target(docs[piece_doc], offset, length), bool)
    piece_doc, offset, length = piece_doc[keep], offset[keep], length[keep]
  row = best_fit_decreasing(length, capacity)
  rank = np.empty(len(length), np.int64)  # Within a row, pieces in the order they were placed.
  rank[np.argsort(-length, kind='stable')] = np.arange(len(length))
  by_row = np.lexsort((rank, row))
  counts = np.bincount(row, minlength=int(row.max()) + 1 if len(row) else 0)
  return Plan(docs[piece_doc[by_row]], offset[by_row], length[by_row],
              np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))


def concat_plans(plans: list[Plan]) -> tuple[Plan, np.ndarray]:
  """One plan of `plans`' rows back to back, and where each plan's rows start [len + 1]."""
  rows = np.array([0] + [p.num_rows for p in plans], np.int64)
  pieces = np.cumsum([0] + [len(p.doc) for p in plans])
  starts = [p.row_start[:-1] + base for p, base in zip(plans, pieces[:-1])]
  joined = Plan(*(np.concatenate([getattr(p, f) for p in plans]).astype(np.int64)
                  for f in ('doc', 'offset', 'length')),
                np.concatenate([*starts, [pieces[-1]]]).astype(np.int64))
  return joined, np.cumsum(rows)


def efficiency(plan: Plan, capacity: int) -> float:
  """The non-padding fraction of the plan's targets (a row of f tokens has f - 1 of its
  capacity - 1 targets filled)."""
  rows = plan.num_rows
  return float((np.sum(plan.length) - rows) / max(rows * (capacity - 1), 1))


@dataclasses.dataclass(frozen=True)
class _Layout:
  """Where each token of rows' pieces goes: row r_, column col, from piece piece (index into
  the selected pieces), `within` tokens into it; `seg` is each piece's segment id."""

  r_: np.ndarray
  col: np.ndarray
  piece: np.ndarray
  within: np.ndarray
  seg: np.ndarray
  pieces: np.ndarray  # Indices into the plan.


def _layout(plan: Plan, rows: np.ndarray) -> _Layout:
  """Row -1 is an empty row (all padding)."""
  safe = np.maximum(rows, 0)
  first = np.where(rows >= 0, plan.row_start[safe], 0)
  count = np.where(rows >= 0, plan.row_start[safe + 1], 0) - first
  row_base = np.cumsum(count) - count  # Selected-piece index of each row's first piece.
  piece_row_base = np.repeat(row_base, count)
  pieces = np.repeat(first, count) + np.arange(count.sum(), dtype=np.int64) - piece_row_base
  length = np.asarray(plan.length[pieces], np.int64)
  token_base = np.cumsum(length) - length  # First token (over all selected pieces) of each.
  col0 = token_base - token_base[piece_row_base]
  piece = np.repeat(np.arange(len(pieces), dtype=np.int64), length)
  within = np.arange(int(length.sum()), dtype=np.int64) - token_base[piece]
  seg = np.arange(len(pieces), dtype=np.int64) - piece_row_base + 1
  r_of_piece = np.repeat(np.arange(len(rows), dtype=np.int64), count)
  return _Layout(r_of_piece[piece], col0[piece] + within, piece, within, seg, pieces)


def pack_rows(plan: Plan, rows: np.ndarray, doc_start: np.ndarray,
              tokens_at: Callable[[np.ndarray], np.ndarray], capacity: int, pad_id: int,
              prompt_len: np.ndarray | None = None,
              trained_at: Callable[[np.ndarray], np.ndarray] | None = None) -> Batch:
  """The batch of rows `rows` (int array of any shape S; -1 = an empty row) of `plan`: keys
  inputs, targets,
  segment_ids, positions (int32) and mask (float32), each S + [capacity - 1].

  `doc_start[d]` is document d's first token in the store and `tokens_at(index)` reads the
  store's tokens at int64 indices; `prompt_len[d]` (SFT) is the number of prompt tokens of
  document d, whose targets are masked; `trained_at(index)` (chat data) says which tokens at
  store indices are targets, every other target being masked.
  """
  shape, rows = np.shape(rows), np.asarray(rows, np.int64).ravel()
  lay = _layout(plan, rows)
  doc = np.asarray(plan.doc[lay.pieces], np.int64)
  offset = np.asarray(plan.offset[lay.pieces], np.int64)
  token = offset[lay.piece] + lay.within  # Index within the document.
  tokens = np.full((len(rows), capacity), pad_id, np.int32)
  index = np.asarray(doc_start[doc], np.int64)[lay.piece] + token
  tokens[lay.r_, lay.col] = tokens_at(index)
  seg = np.zeros((len(rows), capacity), np.int32)
  seg[lay.r_, lay.col] = lay.seg[lay.piece]
  positions = np.zeros((len(rows), capacity), np.int32)
  positions[lay.r_, lay.col] = lay.within
  scored = np.zeros((len(rows), capacity), bool)
  scored[lay.r_, lay.col] = (True if prompt_len is None else
                             token >= np.asarray(prompt_len[doc], np.int64)[lay.piece])
  if trained_at is not None:
    scored[lay.r_, lay.col] &= trained_at(index)
  mask = (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] > 0) & scored[:, 1:]
  out = {'inputs': tokens[:, :-1], 'targets': tokens[:, 1:], 'segment_ids': seg[:, :-1],
         'positions': positions[:, :-1], 'mask': mask.astype(np.float32)}
  return {k: v.reshape(*shape, capacity - 1) for k, v in out.items()}


def target_docs(plan: Plan, rows: np.ndarray, capacity: int) -> np.ndarray:
  """int64 [len(rows), capacity - 1]: the document of each target that shares its input's
  segment (whatever SFT masks), else -1 (padding and the first token of each piece)."""
  rows = np.asarray(rows, np.int64).ravel()
  lay = _layout(plan, rows)
  docs = np.full((len(rows), capacity), -1, np.int64)
  docs[lay.r_, lay.col] = np.asarray(plan.doc[lay.pieces], np.int64)[lay.piece]
  first = np.zeros((len(rows), capacity), bool)
  first[lay.r_, lay.col] = lay.within == 0
  return np.where(first[:, 1:], -1, docs[:, 1:])


def plan_lines(meta: dict) -> str:
  """'# packing efficiency: ...' (the non-pad fraction of the training targets), and the pieces
  and documents left out for holding no target: a packed source's config lines."""
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
