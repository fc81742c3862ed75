"""`--fdl_set` of a field renamed since it was written: the table saved configs load through
(allow_list.MOVED_ARGUMENTS) sends it to its new path, with one warning line naming that path."""

import logging

import pytest

from paxlike import registry
from paxlike.config import config_io
from paxlike.errors import UserError
from tests.helpers import run_cli


@pytest.fixture
def text_cfg():
  registry.import_all()
  return registry.get('lm.TextLM')().config()


def test_a_moved_row_field_sets_its_new_path_and_says_so(text_cfg, caplog):
  with caplog.at_level(logging.WARNING, logger='absl'):
    config_io.apply_overrides(text_cfg, ['data.client_field=speaker',
                                         'data.txt_document=paragraph'])
  assert text_cfg.data.fields.client_field == 'speaker'
  assert text_cfg.data.fields.txt_document == 'paragraph'
  assert [r.getMessage() for r in caplog.records] == [
      '--fdl_set data.client_field: this field is data.fields.client_field now',
      '--fdl_set data.txt_document: this field is data.fields.txt_document now']


def test_the_old_path_and_the_new_one_set_the_same_config(text_cfg):
  new = registry.get('lm.TextLM')().config()
  config_io.apply_overrides(new, ['data.fields.client_field=speaker'])
  config_io.apply_overrides(text_cfg, ['data.client_field=speaker'])
  assert config_io.to_json(text_cfg) == config_io.to_json(new)


def test_only_the_sources_whose_fields_moved_take_the_old_names(text_cfg):
  with pytest.raises(UserError, match='data.nope: no such field'):
    config_io.apply_overrides(text_cfg, ['data.nope=1'])
  stdlib = registry.get('lm.StdlibTiny')().config()  # Its data never had a client_field.
  with pytest.raises(UserError, match='data.client_field: no such field'):
    config_io.apply_overrides(stdlib, ['data.client_field=speaker'])
  assert config_io.moved_path(stdlib, 'nope.client_field') is None
  assert config_io.moved_path(text_cfg, 'data.client_field') == 'data.fields.client_field'


def test_the_command_line_takes_the_old_name_with_one_note(tmp_path):
  (tmp_path / 'a.txt').write_text('one paragraph\n\nanother\n')
  proc = run_cli('--exp=lm.TextLM', '--mode=print_config', f'--fdl_set=data.files={tmp_path}/a.txt',
                 '--fdl_set=data.txt_document=paragraph')
  assert "data.fields.txt_document = 'paragraph'" in proc.stdout.splitlines()
  notes = [line for line in proc.stderr.splitlines() if 'txt_document' in line]
  assert len(notes) == 1 and notes[0].endswith(
      '--fdl_set data.txt_document: this field is data.fields.txt_document now'), proc.stderr
