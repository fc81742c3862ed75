"""The LM family's answers, each against an independent computation."""

import types

import fiddle as fdl
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from paxlike import registry
from paxlike.config import config_io
from paxlike.errors import UserError
from paxlike.families import family_of, lm
from paxlike.layers import MlpClassifier, TransformerLM
from paxlike.core.partitioning import MeshConfig

MODEL = TransformerLM(vocab_size=256, num_layers=2, d_model=32, num_heads=4, d_ff=64, max_len=64)
FAMILY = lm.FAMILY


_INIT = jax.jit(MODEL.init)  # One program: eagerly, every op of the init compiles on its own.


def _params(seq=16):
  return nn.unbox(_INIT(jax.random.key(0), jnp.zeros((1, seq), jnp.int32)))['params']


def test_every_form_of_a_transformer_is_in_the_lm_family():
  assert family_of(MODEL) is family_of(TransformerLM) is family_of(fdl.Config(TransformerLM))
  assert FAMILY.name == 'lm' and FAMILY.item == 'tokens' and FAMILY.can_decode


def test_step_flops_are_6n_plus_causal_attention_per_token():
  """N: every matrix of the real param tree (the tied embedding is the output projection; the
  1-D norm scales do no matmul); attention 12·L·d·(T + 1)/2; per device."""
  seq, shape, devices = 16, (2, 3, 4), 4
  n = sum(x.size for x in jax.tree.leaves(_params(seq=seq)) if x.ndim >= 2)
  per_token = 6 * n + 12 * 2 * 32 * (seq + 1) / 2
  batches = {'inputs': np.zeros((*shape, seq), np.int32), 'mask': np.ones((*shape, seq))}
  flops = FAMILY.step_flops(MODEL, None, None, batches, devices)
  assert flops == per_token * np.prod(shape) * seq / devices
  assert FAMILY.items_per_step(batches) == np.prod(shape) * seq


def test_summary_counts_the_initialised_params():
  data = types.SimpleNamespace(seq_len=16)
  count = sum(x.size for x in jax.tree.leaves(_params()))
  lines = FAMILY.summary(MODEL.clone(attention_impl='xla'), data).splitlines()
  assert lines[0] == '# attention kernel: xla' and lines[1] == f'# params: {count:,}'
  assert lines[2].startswith('# train FLOPs per token (seq_len 16): ')


def test_memory_summary_counts_float32_params_gradients_and_adamw_moments():
  data = types.SimpleNamespace(seq_len=16, batch_size=8, clients_per_round=1, local_steps=1,
                               rows_per_item=1)
  task = types.SimpleNamespace(model=MODEL, data=data, optimizer=optax.adamw(1e-3),
                               mesh=MeshConfig())
  n = sum(x.size for x in jax.tree.leaves(_params()))
  line = FAMILY.memory_summary(task).splitlines()[0]
  assert line.startswith('# memory per device on 1 devices (data 1): ')
  parts = line.split('= ')[1]
  assert f'params {n * 4 / 1e9:.2f} ' in parts and f'gradients {n * 4 / 1e9:.2f} ' in parts


def test_the_ensemble_is_mixed_by_the_domain_posterior():
  """At position 0 the posterior is the prior, so the mixture there is Σ prior_k p_k; later
  positions weigh each expert by how well it predicted the context."""
  experts = jax.tree.map(lambda *x: np.stack(x), _params(), jax.tree.map(
      lambda p: np.asarray(p) + np.float32(0.5), _params()))
  tokens = np.asarray(jax.random.randint(jax.random.key(1), (2, 8), 0, 256))
  prior = np.array([0.25, 0.75])

  def apply(params, inputs):
    return MODEL.apply({'params': params}, inputs)

  # Jitted: eagerly, every op of the model compiles on its own.
  mixed = jax.jit(FAMILY.mix_ensemble, static_argnums=0)(apply, experts, tokens, jnp.log(prior))
  softmax = jax.jit(lambda params: jax.nn.softmax(apply(params, tokens)))
  probs = np.stack([softmax(jax.tree.map(lambda x: x[k], experts)) for k in range(2)])
  np.testing.assert_allclose(np.exp(mixed[:, 0]), np.tensordot(prior, probs[:, :, 0], 1),
                             rtol=1e-5, atol=1e-7)
  likelihood = probs[:, 0, 0, tokens[0, 1]] * prior
  posterior = likelihood / likelihood.sum()
  np.testing.assert_allclose(np.exp(mixed[0, 1]), np.tensordot(posterior, probs[:, 0, 1], 1),
                             rtol=1e-5, atol=1e-7)


def test_a_vocab_smaller_than_the_datas_is_a_user_error_naming_both():
  data = types.SimpleNamespace(item='tokens', vocab_size=300)
  with pytest.raises(UserError) as error:
    FAMILY.check_data(MODEL, data)
  assert str(error.value) == ("model.vocab_size=256 is smaller than the data's vocab_size=300 "
                              "(its tokenizer's ids): set model.vocab_size >= 300")
  FAMILY.check_data(MODEL.clone(vocab_size=300), data)  # Equal, and larger, are fine.
  FAMILY.check_data(MODEL.clone(vocab_size=512), data)


def test_building_a_task_checks_the_vocab_against_the_byte_data():
  registry.import_all()
  cfg = registry.get('federated.ShakespeareFedAvg')().config()
  config_io.apply_overrides(cfg, ['model.vocab_size=200'])
  with pytest.raises(UserError, match=r'model.vocab_size=200 .* vocab_size=256 '):
    config_io.build(cfg)


def test_an_lm_on_example_data_is_a_user_error():
  with pytest.raises(UserError, match='TransformerLM trains on tokens but the data'):
    FAMILY.check_data(MODEL, types.SimpleNamespace(item='examples'))
  with pytest.raises(UserError, match='MlpClassifier trains on examples'):
    family_of(MlpClassifier()).check_data(MlpClassifier(), types.SimpleNamespace(item='tokens'))


def test_the_family_does_not_count_clients_and_shrink():
  assert not hasattr(FAMILY, 'population')  # The data source counts them: client_sizes.
  cfg = fdl.Config(TransformerLM, num_layers=12)
  family_of(cfg).shrink(cfg)
  assert cfg.num_layers == 1


def test_the_eval_step_refuses_items_other_than_the_familys():
  from paxlike.trainer import evaluation
  with pytest.raises(UserError, match='TransformerLM is evaluated on tokens, not examples'):
    evaluation.eval_step(MODEL, 'examples', 1)


def test_a_vocab_left_unset_follows_the_datas_rounded_up_to_128():
  unset = MODEL.clone(vocab_size=None)
  assert FAMILY.complete(unset, types.SimpleNamespace(vocab_size=2000)).vocab_size == 2048
  assert FAMILY.complete(unset, types.SimpleNamespace(vocab_size=2048)).vocab_size == 2048
  assert FAMILY.complete(MODEL, types.SimpleNamespace(vocab_size=2000)) is MODEL
  with pytest.raises(UserError, match='model.vocab_size=None follows .* has no vocab_size'):
    FAMILY.complete(unset, types.SimpleNamespace(vocab_size=None))


def test_a_task_on_text_data_takes_its_vocab_from_the_tokenizer(tmp_path):
  """An LM with vocab_size unset on a TextData source: the Task's model has the tokenizer's
  vocabulary rounded up to 128; one set below it is refused."""
  from paxlike.trainer.centralized import centralized
  from paxlike.data import TextData
  from paxlike.trainer.task import Task
  from paxlike.tokenizers import load_tokenizer
  (tmp_path / 'a.txt').write_text('some text\n\nmore text\n')
  data = TextData(files=str(tmp_path / 'a.txt'), tokenizer='bytes', seq_len=16, batch_size=2)
  task = Task(model=MODEL.clone(vocab_size=None), optimizer=optax.sgd(0.1),
              algorithm=centralized, data=data)
  vocab = load_tokenizer('bytes').vocab_size
  assert data.vocab_size == vocab and task.model.vocab_size == -(-vocab // 128) * 128
  with pytest.raises(UserError, match=f'model.vocab_size=100 is smaller .* vocab_size={vocab} '):
    Task(model=MODEL.clone(vocab_size=100), optimizer=optax.sgd(0.1), algorithm=centralized,
         data=data)
