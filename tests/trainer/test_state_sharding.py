"""The optimizer state is sharded like the params it mirrors (it used to come out replicated,
so every step all-gathered the update into it)."""

import json
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax

from paxlike.core import partitioning
from tests.helpers import run_script


def test_only_subtrees_shaped_like_the_params_are_constrained():
  params = {'w': jnp.ones((4, 2)), 'b': jnp.ones(2)}
  mesh = jax.make_mesh((1,), ('model',), axis_types=(jax.sharding.AxisType.Auto,))
  shardings = jax.tree.map(lambda _: jax.sharding.NamedSharding(mesh, jax.P()), params)
  state = {'mu': params, 'count': jnp.int32(0),
           'placed': jax.tree.map(lambda x: jnp.stack([x, x]), params)}  # [clients, ...]

  def constraints(tree):
    jaxpr = jax.make_jaxpr(lambda t: partitioning.constrain_like_params(t, params, shardings))
    return str(jaxpr(tree)).count('sharding_constraint')

  assert constraints(state) == 2  # mu's two leaves; not the count, not the client-placed copy.
  assert constraints(optax.adam(0.1).init(params)) == 4  # Adam's mu and nu.


def test_adam_moments_have_the_param_shardings_on_a_model_parallel_mesh():
  out = run_script(textwrap.dedent('''
      import json
      import jax
      import optax
      from paxlike.configs import fiddlers
      from paxlike import registry
      from paxlike.config import config_io
      from paxlike.trainer import build
      registry.import_all()
      cfg = registry.get('lm.StdlibTiny')().config()
      fiddlers.cpu8(cfg)
      config_io.apply_overrides(cfg, ['model.num_layers=1', 'data.seq_len=16',
                                      'data.batch_size=8'])
      s = build.setup(config_io.build(cfg))
      spec = lambda tree: [str(x.sharding.spec) for x in jax.tree.leaves(tree)]
      moment = lambda name: optax.tree_utils.tree_get(s.program.abstract_state.alg.opt_state, name)
      print(json.dumps({'params': spec(s.program.abstract_state.alg.params),
                        'mu': spec(moment('mu')), 'nu': spec(moment('nu'))}))
  '''))
  specs = json.loads(out.strip().splitlines()[-1])
  assert specs['mu'] == specs['nu'] == specs['params']
  assert sum("'model'" in s for s in specs['params']) >= 5  # The mesh really splits weights.
