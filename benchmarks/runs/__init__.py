"""The timed runs: ours beside the `tf.distribute` (or plain) equivalent, in the same run.

Each module is a command, `python -m benchmarks.runs.NAME [--json FILE]`, that
writes its figures as JSON (`common.write_result`); `run_all` runs those this
machine can into benchmarks/results/.
"""
