"""The in-graph engine: every local replica's step traced into one graph
(`engine.InGraphEngine`; docs/design.md, "The in-graph engine")."""
