"""The contracts every other package of paxlike shares, in a leaf package (it imports nothing of
paxlike but `errors`): the algorithm record and what it declares (`algorithm`), the loss-function
type (`loss`), the batch keys the data writes and the algorithms read (`batch`), the split and
merge of trainable params (`trainable`), the optimizer presets whose learning rate is readable
(`optim`), the mesh with its axis names, the clients axis among them (`partitioning`), the
size of XLA:CPU's worker pool that forced host devices need (`cpu_pool`), and the one way a file
or directory is written whole (`files`).

Federated algorithms depend on these alone, as drjax's algorithms depend on its API; the trainer
runs any `Algorithm` through them."""
