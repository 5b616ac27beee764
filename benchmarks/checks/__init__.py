"""Correctness checks against one-device oracles, for hardware the suite lacks.

`tpu_check` on a TPU (`--stand_in N` or `--fake_tpu` here), `gpu_check` on
the device machine's GPU (`--cpu` here); each prints PASS or FAIL per check.
"""
