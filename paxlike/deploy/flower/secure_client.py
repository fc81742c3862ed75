"""The ClientApp of a run with `--secure_aggregation`: the same node config and `query` answer
as client_app.py, and a train handler inside Flower's `secaggplus_mod` that answers the legacy
fit message SecAgg+ carries (the train message's values as a parameter list, the once values
kept as client_app keeps them): it runs the client program for the node's slots (client_app's
`run_slots`) and returns the sum over them of each summed value, scaled (secure.node_sum), for
the mod to quantize and mask."""

from __future__ import annotations

import numpy as np
from flwr.app import Context, Message
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.compat.common import recorddict_compat as compat

from paxlike.deploy.flower import client_app, once, records, secure

app = ClientApp()
app.query()(client_app.query)


@app.train(mods=[secaggplus_mod])
def train(msg: Message, context: Context) -> Message:
  """This node's scaled sums for the round SecAgg+ is collecting (num_examples 1: the workflow
  weights every node alike, so its result is the nodes' mean)."""
  fitins = compat.recorddict_to_fitins(msg.content, keep_input=True)
  step, slots, clients, live, scales, keys = secure.read_fit_config(fitins.config)
  received = dict(zip(keys, parameters_to_ndarrays(fitins.parameters)))
  kept = once.kept(context, records.with_prefix(received, records.ONCE))
  by_slot = client_app.run_slots(context, step, slots, clients, live, received, kept)
  plan = records.read_plan(str(context.node_config['export-dir']))
  sums = secure.node_sum(plan, [by_slot[s] for s in slots], scales)
  fitres = FitRes(Status(Code.OK, 'ok'), ndarrays_to_parameters([np.asarray(s) for s in sums]),
                  1, {})
  return Message(compat.fitres_to_recorddict(fitres, keep_input=True), reply_to=msg)
