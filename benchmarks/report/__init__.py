"""benchmarks/RESULTS.md from the results' JSON: `python -m benchmarks.report --no-run`.

`render` writes the file, `sections` and `other_sections` a table each, and
`targets` judges a figure by targets.json. Nothing here runs a benchmark.
"""
