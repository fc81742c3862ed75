"""`--mode=decode --chat` notes a template that ignores add_generation_prompt
(ChatEncoder.generation_prompt_note; the CLI's stderr in tests/test_chat_cli.py)."""

import pytest

from paxlike.tokenizers import load_tokenizer
from paxlike.tokenizers.chat_encoder import load_chat_encoder
from tests.tokenizers.chat_fixtures import FAMILIES, write_family
from tests.tokenizers.test_chat_closing_text import write_phi3


@pytest.mark.parametrize('family', sorted(FAMILIES))
def test_only_a_template_without_a_generation_prompt_gets_the_note(tmp_path, family):
  encoder = load_chat_encoder(load_tokenizer(write_family(tmp_path, family)))
  note = encoder.generation_prompt_note()
  if family == 'mistral':  # Its template has no add_generation_prompt branch at all.
    assert note == (f'note: chat template {tmp_path}/tokenizer_config.json ignores '
                    'add_generation_prompt (a user turn renders the same with and without it), '
                    "so each reply is sampled right after the user's turn with no assistant "
                    "header: right for templates whose user turn ends the prompt (Mistral's "
                    "[/INST]); with others the model may go on with the user's turn")
  else:
    assert note is None


def test_a_template_that_writes_other_text_without_the_prompt_gets_no_note(tmp_path):
  # Phi-3 writes eos_token where the prompt would be: it reads add_generation_prompt.
  encoder = load_chat_encoder(load_tokenizer(write_phi3(tmp_path)))
  assert encoder.generation_prompt_note() is None
