"""A checkpoint's chat template: found beside its tokenizer, rendered as transformers renders it.

The template is `chat_template.jinja` in the tokenizer's directory, else `tokenizer_config.json`'s
`chat_template` (a Jinja string, or a list of named templates of which 'default' is used). It is
rendered in Jinja's immutable sandbox with trim_blocks and lstrip_blocks, the loopcontrols
extension, a `tojson` that does not escape HTML, `raise_exception(message)` and
`strftime_now(format)`, and the variables `messages`, `tools` and `documents` (None),
`add_generation_prompt` and the special tokens tokenizer_config.json names (bos_token, eos_token,
...; special_tokens_map.json's for roles it leaves out), as transformers' `apply_chat_template`
does. `{% generation %}...{% endgeneration %}`
blocks render their body and record where it lies in the output (transformers' assistant mask).

Any failure of a template (a syntax error, an unknown filter, a `raise_exception` call, an error
while rendering) is a UserError naming the file that holds it.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import threading
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from paxlike.errors import UserError

TEMPLATE_FILE = 'chat_template.jinja'
CONFIG_FILE = 'tokenizer_config.json'
SPECIAL_TOKENS_FILE = 'special_tokens_map.json'
# The special tokens transformers' special_tokens_map puts into a template's variables.
TOKEN_ROLES = ('bos_token', 'eos_token', 'unk_token', 'sep_token', 'pad_token', 'cls_token',
               'mask_token')
Span = tuple[int, int]  # [start, end) characters of a rendered string.

_TRACKED = threading.local()  # This thread's render: its output pieces and generation spans.


class _TemplateRaised(Exception):
  """`raise_exception(message)` called by a template."""


class _GenerationBlocks(jinja2.ext.Extension):
  """`{% generation %}BODY{% endgeneration %}`: renders BODY, and while a tracked render runs on
  this thread (`_render_tracked`), records BODY's [start, end) in the output."""

  tags = {'generation'}

  def parse(self, parser: Any) -> jinja2.nodes.Node:
    lineno = next(parser.stream).lineno
    body = parser.parse_statements(('name:endgeneration',), drop_needle=True)
    return jinja2.nodes.CallBlock(self.call_method('_body'), [], [], body).set_lineno(lineno)

  def _body(self, caller: Any) -> str:
    text = caller()
    pieces = getattr(_TRACKED, 'pieces', None)
    if pieces is not None:
      start = sum(map(len, pieces))
      _TRACKED.spans.append((start, start + len(text)))
    return text


def _raise_exception(message: Any) -> None:
  raise _TemplateRaised(str(message))


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
  """JSON of `value` without Jinja's HTML escaping (what chat templates expect)."""
  return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                    sort_keys=sort_keys)


def _strftime_now(format_: str) -> str:
  return datetime.datetime.now().strftime(format_)


def _environment() -> ImmutableSandboxedEnvironment:
  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                      extensions=[_GenerationBlocks, jinja2.ext.loopcontrols])
  env.filters['tojson'] = _tojson
  env.globals['raise_exception'] = _raise_exception
  env.globals['strftime_now'] = _strftime_now
  return env


def _one_line(text: str) -> str:
  return ' '.join(str(text).split())


class ChatTemplate:
  """A Jinja chat template (`source`, read from the file `path`) and the special tokens its
  renders see. Pickles as its source; compiled on first use in each process."""

  def __init__(self, source: str, path: str, special_tokens: dict[str, Any] | None = None):
    self.source, self.path = source, path
    self.special_tokens = dict(special_tokens or {})
    self.fingerprint = hashlib.sha256(json.dumps(
        [source, self.special_tokens], sort_keys=True).encode('utf-8')).hexdigest()
    self._compiled: jinja2.Template | None = None
    self.compiled()  # A template that does not compile is refused at once.
    # Whether the template marks assistant output with {% generation %} blocks.
    self.has_generation_blocks = any(
        _calls_generation(node)
        for node in _environment().parse(source).find_all(jinja2.nodes.CallBlock))

  def compiled(self) -> jinja2.Template:
    if self._compiled is None:
      try:
        self._compiled = _environment().from_string(self.source)
      except jinja2.TemplateSyntaxError as error:
        raise UserError(f'chat template {self.path}: line {error.lineno}: '
                        f'{_one_line(error.message or "syntax error")}') from None
    return self._compiled

  def _variables(self, messages: list[dict], add_generation_prompt: bool) -> dict[str, Any]:
    return {**self.special_tokens, 'messages': messages, 'tools': None, 'documents': None,
            'add_generation_prompt': add_generation_prompt}

  def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
    """The template's text of `messages`, with the assistant header after it when
    `add_generation_prompt`."""
    return self._guarded(messages, lambda: self.compiled().render(
        self._variables(messages, add_generation_prompt)))

  def render_tracked(self, messages: list[dict]) -> tuple[str, list[Span]]:
    """The text of `messages` and the character spans of its {% generation %} blocks."""
    return self._guarded(messages, lambda: self._render_tracked(messages))

  def _render_tracked(self, messages: list[dict]) -> tuple[str, list[Span]]:
    _TRACKED.pieces, _TRACKED.spans = [], []
    try:
      for piece in self.compiled().generate(self._variables(messages, False)):
        _TRACKED.pieces.append(piece)
      return ''.join(_TRACKED.pieces), list(_TRACKED.spans)
    finally:
      _TRACKED.pieces = _TRACKED.spans = None

  def _guarded(self, messages: list[dict], render: Any) -> Any:
    """`render()`, any failure of the template a UserError naming it and the messages' roles."""
    try:
      return render()
    except UserError:
      raise
    except _TemplateRaised as error:
      problem = f'raise_exception({_one_line(str(error))!r})'
    except jinja2.TemplateError as error:
      problem = f'{type(error).__name__}: {_one_line(error.message or str(error))}'
    except Exception as error:  # pylint: disable=broad-except (the template is the user's code)
      problem = f'{type(error).__name__}: {_one_line(str(error))}'
    roles = ', '.join(str(m.get('role')) for m in messages if isinstance(m, dict)) or 'none'
    raise UserError(f'chat template {self.path} failed on a conversation of roles [{roles}]: '
                    f'{problem}')

  def __getstate__(self) -> dict[str, Any]:
    return {**self.__dict__, '_compiled': None}

  def __repr__(self) -> str:
    return f'ChatTemplate({self.path!r})'


def _calls_generation(node: jinja2.nodes.CallBlock) -> bool:
  """Whether `node` is a {% generation %} block (what _GenerationBlocks.parse makes)."""
  target = getattr(node.call, 'node', None)
  return (isinstance(target, jinja2.nodes.ExtensionAttribute)
          and target.identifier == _GenerationBlocks.identifier)


def _read_json(path: Path) -> dict[str, Any]:
  try:
    value = json.loads(path.read_text('utf-8'))
  except (OSError, ValueError) as error:
    raise UserError(f'tokenizer config {path}: not a readable JSON file ({error})') from None
  return value if isinstance(value, dict) else {}


def special_tokens(config: dict[str, Any]) -> dict[str, Any]:
  """The template variables of tokenizer_config.json's special tokens: each role's string
  (a null role left out) and additional_special_tokens."""
  found: dict[str, Any] = {}
  for role in TOKEN_ROLES:
    value = config.get(role)
    value = value.get('content') if isinstance(value, dict) else value
    if isinstance(value, str):
      found[role] = value
  extra = config.get('additional_special_tokens')
  if isinstance(extra, list):
    found['additional_special_tokens'] = [t.get('content') if isinstance(t, dict) else t
                                          for t in extra]
  return found


def _named_template(value: Any, path: Path) -> str:
  """tokenizer_config.json's chat_template: a string, or the 'default' of a list of
  {name, template}."""
  if isinstance(value, str):
    return value
  if isinstance(value, list):
    named = {t.get('name'): t.get('template') for t in value if isinstance(t, dict)}
    if isinstance(named.get('default'), str):
      return named['default']
    raise UserError(f'chat template {path}: chat_template is a list of templates without a '
                    f'"default" one (names: {", ".join(map(str, named)) or "none"})')
  raise UserError(f'chat template {path}: chat_template is a {type(value).__name__}, not a '
                  'Jinja string or a list of named templates')


def load_chat_template(tokenizer_path: str | Path) -> ChatTemplate:
  """The chat template of the tokenizer at `tokenizer_path` (a tokenizer file or its directory):
  chat_template.jinja beside it, else tokenizer_config.json's chat_template. A directory with
  neither is a UserError."""
  directory = Path(tokenizer_path).expanduser()
  directory = directory if directory.is_dir() else directory.parent
  config_path = directory / CONFIG_FILE
  config = _read_json(config_path) if config_path.is_file() else {}
  tokens = special_tokens(config)
  mapping = directory / SPECIAL_TOKENS_FILE  # Roles tokenizer_config.json leaves unnamed.
  if mapping.is_file():
    tokens = {**special_tokens(_read_json(mapping)), **tokens}
  jinja_path = directory / TEMPLATE_FILE
  if jinja_path.is_file():
    try:
      return ChatTemplate(jinja_path.read_text('utf-8'), str(jinja_path), tokens)
    except (OSError, UnicodeDecodeError) as error:
      raise UserError(f'chat template {jinja_path}: cannot be read ({error})') from None
  if config.get('chat_template') is None:
    raise UserError(f'tokenizer directory {directory}: no chat template (neither '
                    f'{TEMPLATE_FILE} nor a chat_template in {CONFIG_FILE})')
  return ChatTemplate(_named_template(config['chat_template'], config_path), str(config_path),
                      tokens)
