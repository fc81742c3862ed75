"""Pytree structures as JSON that round-trips, and dotted names for their leaves."""

from __future__ import annotations

from typing import Any

import jax

from paxlike.config import allow_list, names
from paxlike.errors import UserError


def leaf_names(prefix: str, tree: Any) -> list[str]:
  """`prefix.path.to.leaf` for every leaf of `tree`, in flattening order."""
  paths = jax.tree_util.tree_flatten_with_path(tree)[0]
  return ['.'.join(filter(None, [prefix, jax.tree_util.keystr(p, simple=True, separator='.')]))
          for p, _ in paths]


def to_json(tree: Any) -> dict[str, Any]:
  """The structure of `tree`: dicts, lists, tuples, namedtuples (by class), None and leaves."""
  if tree is None:
    return {'type': 'none'}
  if isinstance(tree, tuple) and hasattr(tree, '_fields'):
    cls = type(tree)
    return {'type': 'namedtuple', 'class': f'{cls.__module__}.{cls.__qualname__}',
            'fields': {f: to_json(getattr(tree, f)) for f in tree._fields}}
  if isinstance(tree, (tuple, list)):
    return {'type': type(tree).__name__, 'items': [to_json(x) for x in tree]}
  if isinstance(tree, dict):
    if not all(isinstance(k, str) for k in tree):
      raise UserError(f'cannot describe a dict with non-string keys {sorted(map(repr, tree))[:3]}')
    return {'type': 'dict', 'items': {k: to_json(tree[k]) for k in sorted(tree)}}
  if jax.tree_util.treedef_is_leaf(jax.tree.structure(tree)):
    return {'type': 'leaf'}
  raise UserError(f'cannot describe pytree node type {type(tree).__qualname__}')


def from_json(doc: dict[str, Any]) -> jax.tree_util.PyTreeDef:
  """The tree structure `doc` describes; namedtuple classes come from allow-listed modules."""
  return jax.tree.structure(_skeleton(doc))


def _skeleton(doc: dict[str, Any]) -> Any:
  kind = doc['type']
  if kind == 'none':
    return None
  if kind == 'leaf':
    return 0
  if kind in ('tuple', 'list'):
    return {'tuple': tuple, 'list': list}[kind](_skeleton(x) for x in doc['items'])
  if kind == 'dict':
    return {k: _skeleton(v) for k, v in doc['items'].items()}
  if kind == 'namedtuple':
    return _namedtuple(doc['class'])(**{f: _skeleton(v) for f, v in doc['fields'].items()})
  raise UserError(f'unknown tree node type {kind!r}')


def _namedtuple(name: str) -> type:
  def refusal(cls: Any) -> str | None:
    if isinstance(cls, type) and issubclass(cls, tuple) and allow_list.is_allowed(cls.__module__):
      return None
    return 'it is not a named tuple a plan may use'
  return names.resolve(name, 'tree node class', allow_list.ALLOWED_MODULES, refusal,
                       allow_flag=False, moved=allow_list.moved_module)
