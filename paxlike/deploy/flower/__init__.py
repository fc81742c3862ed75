"""The exported round on Flower: ClientApp, ServerApp and a local federation (docs/flower.md)."""
