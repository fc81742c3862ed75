"""The keys of a round's batches that the data sources write and the algorithms read."""

# The batch key that says which local steps each slot runs: float32 [slots, local_steps,
# batch_size] (every row of a step alike), 1 where the slot runs the step. Present only where
# some slot may run fewer than all (a Poisson cohort's padded slots run none, a straggler
# `straggler_fraction` its first few), so that without them the batches are what they were.
STEP_MASK = 'step_mask'
