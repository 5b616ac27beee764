"""Reductions between replicas and workers (the all-reduce core), and the
`Replica` interface of both engines (`replica_context`); CONTRIBUTING.md lists
the modules, docs/design.md their concepts.
"""
