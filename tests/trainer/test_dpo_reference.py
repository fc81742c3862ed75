"""A full fine-tune's DPO reference (paxlike/trainer/reference.py) on a 4 x 2 data x model mesh
of 8 devices: the frozen copy is sharded like the params, has no optimizer state, equals the
policy at step 0 (the first step's loss is log 2, its margins 0 and its accuracy 0.5 by the tie
convention) and is bitwise unchanged by training while the policy moves."""

import json
import textwrap

import numpy as np
import pytest

from tests.helpers import run_script

SCRIPT = '''
import json, os
os.environ['PAXLIKE_TOKEN_DIR'] = {tokens!r}
import jax
import numpy as np
from paxlike.configs import fiddlers
from paxlike import registry
from paxlike.config import config_io
from paxlike.trainer import build, loop, reference
registry.import_all()
cfg = registry.get('lm.DpoTiny')().config()
fiddlers.tiny(cfg)
fiddlers.cpu8(cfg)
config_io.apply_overrides(cfg, ['model.lora_rank=0', 'data.files={pairs}', 'data.seq_len=32',
                                'data.batch_size=8', 'data.eval_batch_size=8',
                                'data.num_eval_batches=1', 'data.eval_fraction=0.1',
                                'loss.beta=0.5'])
placed = build.setup(config_io.build(cfg), evaluator=False)
program = placed.program
params = program.abstract_state.alg.params
spec = lambda tree: [str(x.sharding.spec) for x in jax.tree.leaves(tree)]
moments = [x for x in jax.tree.leaves(program.abstract_state.alg.opt_state) if x.ndim > 0]
state = program.init(jax.random.key(0))
host = lambda tree: [np.asarray(x).tolist() for x in jax.tree.leaves(tree)]
copy = host(state.alg.params[reference.REFERENCE])  # Before the step (the state is donated).
policy = host(reference.policy(state.alg.params))
new, metrics = placed.step(state, *loop.round_inputs(placed, 1))
metrics = jax.device_get(metrics)
new, _ = placed.step(new, *loop.round_inputs(placed, 2))  # Step 1's learning rate is 0 (warmup).
print(json.dumps({{
    'policy_specs': spec(reference.policy(params)),
    'copy_specs': spec(params[reference.REFERENCE]),
    'params_elements': sum(x.size for x in jax.tree.leaves(reference.policy(params))),
    'moment_elements': sum(x.size for x in moments),
    'copy_is_policy': copy == policy,
    'copy_unchanged': host(new.alg.params[reference.REFERENCE]) == copy,
    'policy_moved': host(reference.policy(new.alg.params)) != policy,
    'loss': float(metrics['loss']), 'margins': float(metrics['rewards/margins']),
    'accuracy': float(metrics['rewards/accuracies'])}}))
'''


@pytest.fixture(scope='module')
def facts(tmp_path_factory):
  root = tmp_path_factory.mktemp('pairs')
  rows = [json.dumps({'prompt': f'word {i}: ', 'chosen': f'w{i}x', 'rejected': f'W{i}X'})
          for i in range(64)]
  (root / 'pairs.jsonl').write_text('\n'.join(rows) + '\n')
  out = run_script(textwrap.dedent(SCRIPT.format(tokens=str(root / 'tokens'),
                                                 pairs=str(root / 'pairs.jsonl'))))
  return json.loads(out.strip().splitlines()[-1])


def test_the_copy_is_sharded_like_the_params_and_has_no_optimizer_state(facts):
  assert facts['copy_specs'] == facts['policy_specs']
  assert any('model' in s for s in facts['copy_specs'])  # Some leaves are split, not replicated.
  assert facts['moment_elements'] == 2 * facts['params_elements']  # Adam's mu and nu: policy.


def test_at_step_0_the_reference_is_the_policy(facts):
  assert facts['copy_is_policy']
  assert facts['loss'] == float(np.float32(np.log(2)))
  assert facts['margins'] == 0.0 and facts['accuracy'] == 0.5


def test_training_moves_the_policy_and_never_the_copy(facts):
  assert facts['policy_moved'] and facts['copy_unchanged']


def test_the_memory_estimate_counts_the_copy_and_both_sequences_of_a_pair():
  import types  # pylint: disable=import-outside-toplevel
  import optax  # pylint: disable=import-outside-toplevel
  from paxlike.core.partitioning import MeshConfig  # pylint: disable=import-outside-toplevel
  from paxlike.families import lm_memory  # pylint: disable=import-outside-toplevel
  from paxlike.layers import TransformerLM  # pylint: disable=import-outside-toplevel
  from paxlike.trainer.preference_loss import PreferenceLoss  # pylint: disable=import-outside-toplevel
  model = TransformerLM(vocab_size=64, num_layers=1, d_model=32, num_heads=2, d_ff=64, max_len=16)

  def estimate(model, loss, pairs):
    data = types.SimpleNamespace(seq_len=16, batch_size=4, rows_per_item=2 if pairs else 1,
                                 clients_per_round=1, local_steps=1)
    task = types.SimpleNamespace(model=model, data=data, loss=loss, mesh=MeshConfig(),
                                 optimizer=optax.adamw(1e-3), train=None)
    return lm_memory.estimate(task, 1)
  full = estimate(model, PreferenceLoss(kind='dpo'), True)
  assert full.reference == full.params > 0
  assert full.total == pytest.approx(full.params * 2 + full.optimizer + full.gradients
                                     + full.activations)
  assert '+ reference ' in full.line()
  lora = model.clone(lora_rank=4, lora_targets=('query',))
  assert estimate(lora, PreferenceLoss(kind='dpo'), True).reference == 0.0  # Adapters off.
  assert estimate(model, PreferenceLoss(kind='simpo'), True).reference == 0.0  # No reference.
  plain = estimate(model, None, False)
  assert plain.reference == 0.0 and '+ reference' not in plain.line()
  assert full.activations == pytest.approx(2 * plain.activations)  # Two sequences a pair.
