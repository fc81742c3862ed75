"""Federated program export: a round split by its federated primitives into a client program,
server programs and the aggregations between them (see docs/export.md).

`python -m paxlike.export` writes them; `python -m paxlike.export.run` executes them. This
package's __init__ imports nothing, so the executor loads no experiment code.
"""
