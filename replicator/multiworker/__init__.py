"""The job's other worker processes (CONTRIBUTING.md lists the modules)."""
