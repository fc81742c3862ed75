"""paxlike: Pax-style experiments on JAX (README.md).

Before anything else, a process that splits the host into more CPU devices than XLA's worker
pool can hold gets a larger pool (core/cpu_pool.py): otherwise their collectives can deadlock.
"""

from paxlike.core import cpu_pool

cpu_pool.size_pool_for_forced_devices()
