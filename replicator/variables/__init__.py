"""What both engines share about variables: which are copies (`registry`),
what a write inside a step becomes (`merge_rules`; `deferred`: the writes
merged at the step's end), the variables a step's first trace creates
(`lifting`), and the in-graph engine's `ReplicatedVariable` (`replicated`).
"""
