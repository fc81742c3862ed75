"""paxlike's own experiments, one module per family; keys are `<module>.<Class>` (e.g.
`lm.StdlibTiny`), the same as when this package was the top-level `experiments`."""
