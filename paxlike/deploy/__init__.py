"""Running an exported federated round (paxlike.export) on a real federated runtime."""
