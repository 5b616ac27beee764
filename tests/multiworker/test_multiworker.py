"""Several worker processes on 127.0.0.1, started through the launcher."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf

import catalogue
import test_equivalence

SCRIPT = os.path.join(os.path.dirname(__file__), "train_mlp.py")
COLLECTIVES = os.path.join(os.path.dirname(__file__), "collectives.py")
SIDE_BY_SIDE = os.path.join(os.path.dirname(__file__), "side_by_side.py")
# Each time limit on a subprocess here only guards against a hang: a job takes
# from a few seconds to a minute alone, and several times that on a machine
# whose cores are busy. What a test checks is in its assertions.
HANG_S = 600
# A constructor told to wait 5 s for its peers (timeout_s=0.5) returns well
# within this, however loaded the machine; the default's wait is 10 minutes.
_JOINED_WITHIN_S = 60


def _launch(tmp_path, *script_args, workers=2, devices=2, timeout_s=HANG_S, script=SCRIPT):
  command = [sys.executable, "-m", "replicator.launch", "--workers", str(workers),
             "--devices-per-worker", str(devices), "--tee", "all", "--", sys.executable, script,
             "--out", str(tmp_path), *script_args]
  done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
  return done.returncode, done.stdout + done.stderr


def _results(tmp_path, workers=2):
  return [dict(np.load(tmp_path / f"worker{w}.npz")) for w in range(workers)]


@pytest.fixture(scope="module")
def two_by_two_trained(tmp_path_factory):
  """One 2-worker x 2-device job that trains a model per optimizer."""
  out = tmp_path_factory.mktemp("two_by_two")
  code, log = _launch(out, "--optimizer", "sonnet_sgd,keras_adam", "--steps", "10")
  assert code == 0, log
  return out


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sonnet_sgd", "keras_adam"])
def test_two_workers_of_two_devices_train_like_one_device(two_by_two_trained, optimizer):
  results = _results(two_by_two_trained / optimizer)
  np.testing.assert_array_equal(results[0]["replica"], [0, 1])
  np.testing.assert_array_equal(results[1]["replica"], [2, 3])
  for key in results[0]:  # workers hold identical variables and losses
    if key != "replica":
      np.testing.assert_array_equal(results[0][key], results[1][key])
  # Oracle: one device, the same global batches, the same initial values.
  x, y = catalogue.classification_data()
  num_variables = len([k for k in results[0] if k.startswith("v")])
  start = [results[0][f"i{i}"] for i in range(num_variables)]
  expected = test_equivalence.train_oracle(
      start, test_equivalence.OPTIMIZERS[optimizer], x, y, steps=10)
  for i, want in enumerate(expected):
    assert catalogue.norm_relative(results[0][f"v{i}"], want) < 1e-5, i


@pytest.mark.slow
def test_every_collective_across_two_workers_matches_numpy(tmp_path):
  code, log = _launch(tmp_path, script=COLLECTIVES)
  assert code == 0, log
  sys.path.insert(0, os.path.dirname(COLLECTIVES))
  try:
    import collectives as worker  # pylint: disable=g-import-not-at-top
  finally:
    sys.path.pop(0)
  n = 4
  x = np.stack([worker.value(r) for r in range(n)])
  i = np.stack([worker.value(r, np.int32) for r in range(n)])
  exact = x.astype(np.float64).sum(0)
  reference = snt.BatchNorm(True, True, decay_rate=0.5)
  for _ in range(2):
    normalized = reference(tf.constant(np.concatenate(x)), is_training=True).numpy()
  results = _results(tmp_path)
  for key in ("norm_moving_mean", "norm_moving_variance"):  # the same bits everywhere
    np.testing.assert_array_equal(results[0][key], results[1][key])
  np.testing.assert_allclose(results[0]["norm_moving_mean"],
                             reference.moving_mean.value.numpy(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(results[0]["norm_moving_variance"],
                             reference.moving_variance.value.numpy(), rtol=1e-5)
  for w, got in enumerate(results):
    np.testing.assert_array_equal(got["replica"], [2 * w, 2 * w + 1])
    np.testing.assert_allclose(got["metric"], x.mean(), rtol=1e-6)  # Keras Mean
    np.testing.assert_array_equal(got["bank"], x[:, 0])  # scatter_update rows
    for r in range(2):  # each local replica holds the job's result
      np.testing.assert_allclose(got["sum"][r], x.sum(0), rtol=1e-6)
      np.testing.assert_allclose(got["mean"][r], x.mean(0), rtol=1e-6)
      np.testing.assert_array_equal(got["max"][r], x.max(0))
      np.testing.assert_array_equal(got["min"][r], i.min(0))
      np.testing.assert_array_equal(got["int_sum"][r], i.sum(0))
      np.testing.assert_array_equal(got["gather0"][r], np.concatenate(x, 0))
      np.testing.assert_array_equal(got["gather_loop"][r], np.concatenate(x, 0))
      np.testing.assert_array_equal(got["gather1"][r], np.concatenate(i, 1))
      np.testing.assert_array_equal(got["broadcast"][r], x[n - 1])
      q = 2 * w + r
      np.testing.assert_allclose(got["norm"][r], normalized[3 * q:3 * q + 3], atol=2e-5)
      np.testing.assert_array_equal(got["any"][r], (x > 10).any(0))
      np.testing.assert_array_equal(got["every"][r], (x > -10).all(0))
      np.testing.assert_array_equal(got["bool_broadcast"][r], x[n - 1] > 10)
      np.testing.assert_array_equal(got["flag"][r], [True, True])
      # Step 2 of the uneven input: parts of 2, 1, 1 and 1 elements.
      parts = [np.array(b, np.float32) for w in range(2)
               for b in worker.uneven_batches(w)[2:]]
      gathered = np.concatenate(parts)
      np.testing.assert_array_equal(got["uneven_gathered"][r], gathered)
      np.testing.assert_array_equal(got["uneven_bf16"][r], gathered)
      np.testing.assert_array_equal(got["uneven_bool"][r], gathered > 100.5)
      # Each of the 4 replicas' losses weighs replica r's part by its positions.
      start = sum(len(p) for p in parts[:2 * w + r])
      part = parts[2 * w + r]
      weights = 1.0 + np.arange(start, start + len(part))
      np.testing.assert_allclose(got["uneven_dw"][r], n * (part * weights).sum())
      # Parts of a static shape: replica q's part is rows 3q to 3q + 2.
      start = x[0].size * (2 * w + r)
      weights = 1.0 + np.arange(start, start + x[0].size)
      np.testing.assert_allclose(got["static_dw"][r],
                                 n * (x[2 * w + r].ravel() * weights).sum(), rtol=1e-6)
      # static parts of other sizes on each replica: each replica's rows of
      # the gathered gradient (every replica's loss weighs them alike)
      np.testing.assert_array_equal(got["sliced_gathered"][r], worker.SLICED)
      q = 2 * w + r
      rows = worker.SLICED[worker.SLICE_BOUNDS[q]:worker.SLICE_BOUNDS[q + 1]]
      np.testing.assert_array_equal(got["sliced_dx"][r], n * rows.sum())
      # reduce_scatter of value(p) as [4, 3]: replica q gets row q of the sum;
      # replica p's loss weighs its row by p + 1, so replica q's input gets
      # p + 1 on its row p.
      as_rows, int_rows = x.reshape(n, n, -1), i.reshape(n, n, -1)
      np.testing.assert_allclose(got["rs_sum"][r], as_rows.sum(0)[q:q + 1], rtol=1e-6)
      np.testing.assert_allclose(got["rs_mean"][r], as_rows.mean(0)[q:q + 1], rtol=1e-6)
      np.testing.assert_array_equal(got["rs_int"][r], int_rows.sum(0)[q:q + 1])
      np.testing.assert_allclose(got["rs_dw"][r],
                                 ((np.arange(n) + 1) * as_rows[q].sum(1)).sum(), rtol=1e-6)
      u = worker.UINT64
      assert got["u64_sum"].dtype == np.uint64 and got["u32_gather"].dtype == np.uint32
      np.testing.assert_array_equal(got["u64_sum"][r], u.sum())  # wraps, as NumPy's
      np.testing.assert_array_equal(got["u64_max"][r], u.max())
      np.testing.assert_array_equal(got["u64_min"][r], u.min())
      np.testing.assert_array_equal(got["u64_gather"][r], u)
      np.testing.assert_allclose(got["c64_sum"][r], x.sum(0) - 2j * x.sum(0), rtol=1e-6)
      assert got["c128_gather"].dtype == np.complex128
      np.testing.assert_array_equal(got["c128_gather"][r], np.concatenate(x + 1j * (x + 1)))
      np.testing.assert_array_equal(got["u32_gather"][r], (u >> np.uint64(32)).astype(np.uint32))
      assert got["int8_sum"].dtype == np.int8 and got["uint16_broadcast"].dtype == np.uint16
      np.testing.assert_array_equal(got["int8_sum"][r], i.sum(0))
      np.testing.assert_array_equal(got["int8_max"][r], i.max(0))
      np.testing.assert_array_equal(got["uint16_broadcast"][r], i[n - 1] + 100)
      err = np.abs(got["bf16_sum_in_float32_one"][r] - exact)  # its shape, [3, 4]
      assert np.all(err <= 2 * 2.0**-8 * np.abs(x).sum(0)), err.max()
      scale = np.abs(x).sum(0)
      for j, factor in enumerate([1, 2]):
        # bfloat16 on the wire: 4 values and 3 sums rounded (2**-8 each) ...
        err = np.abs(got[f"bf16_{j}"][r] - factor * exact)
        assert np.all(err <= factor * 7 * 2.0**-8 * scale), err.max()
        # ... or, summed in float32, the values and each worker's total once.
        err = np.abs(got[f"bf16_sum_in_float32_{j}"][r] - factor * exact)
        assert np.all(err <= factor * 2 * 2.0**-8 * scale), err.max()
      # Buckets side by side (buckets_in_flight=2): each its own sum.
      for j, factor in enumerate([1, 2, 3, -1]):
        np.testing.assert_allclose(got[f"in_flight_{j}"][r], factor * x.sum(0), rtol=1e-6)
      for j, factor in enumerate([1, 2, 3]):
        err = np.abs(got[f"bf16_in_flight_{j}"][r] - factor * exact)
        assert np.all(err <= factor * 7 * 2.0**-8 * scale), err.max()
    # One replica per worker (a replicator on each worker's first device):
    # worker w contributes value(w), its one replica's result at [0]. The ring divides the float32 mean; in
    # bfloat16 the division by 2 is exact, so the error is the sum's alone.
    two = x[:2].astype(np.float64)
    np.testing.assert_array_equal(got["single_sum"][0], x[0] + x[1])
    np.testing.assert_array_equal(got["single_mean"][0], (x[0] + x[1]) / 2)
    np.testing.assert_array_equal(got["single_f64_mean"][0], two.mean(0))
    np.testing.assert_array_equal(got["single_varying_mean"][0], ((x[0] + x[1]) / 2).ravel())
    for j, factor in enumerate([1, 2]):
      for kind in ("bf16", "fp16"):  # 2 values and 1 sum rounded, halved exactly
        bound = 2.0**-8 if kind == "bf16" else 2.0**-11
        err = np.abs(got[f"single_{kind}_mean_{j}"][0] - factor * two.mean(0))
        assert np.all(err <= factor * 3 * bound * np.abs(two).mean(0)), (kind, err.max())


@pytest.mark.slow
@pytest.mark.parametrize("mwms_first", [False, True])
def test_replicators_beside_each_other_and_mwms_in_one_process(tmp_path, mwms_first):
  """Two replicators' keys and MWMS's do not meet; MWMS may start the server."""
  code, log = _launch(tmp_path, *(["--mwms_first"] if mwms_first else []),
                      script=SIDE_BY_SIDE)
  assert code == 0, log
  sys.path.insert(0, os.path.dirname(SIDE_BY_SIDE))
  try:
    import side_by_side as worker  # pylint: disable=g-import-not-at-top
  finally:
    sys.path.pop(0)
  mwms = worker.mwms_value(0) + worker.mwms_value(1)
  for w, got in enumerate(_results(tmp_path)):
    np.testing.assert_array_equal(got["replicas"], [4, 4])
    for i in range(2):
      for r in range(2):  # every replica sums the 4 replicas' values
        np.testing.assert_allclose(got[f"plain{i}"][r], 10 * worker.value(0, 5), rtol=1e-6)
        np.testing.assert_allclose(got[f"compressed{i}"][r], 10 * worker.value(0, 3),
                                   rtol=2.0**-7)
        assert got[f"ids{i}"][r] == 0 + 1 + 2 + 3
      np.testing.assert_allclose(got[f"mwms{i}"], mwms, rtol=1e-6)
    # variables made in repl.context(): the chief's values on every copy
    np.testing.assert_array_equal(got["made_big0"], np.full([2, 20000], 0.5))
    np.testing.assert_array_equal(got["made_big1"], np.full([2, 30000], 1.5))
    assert got["made_big0"].dtype == np.float64
    np.testing.assert_array_equal(got["made_ints"], [[0, 1, 2]] * 2)
    np.testing.assert_array_equal(got["made_flags"], [[True, False]] * 2)
    np.testing.assert_array_equal(got["made_varying"], [worker.value(0, 4)] * 2)


@pytest.mark.slow
@pytest.mark.parametrize("uneven", ["--uneven", "--short_last_step"])
def test_uneven_data_stops_every_worker_at_the_same_step(tmp_path, uneven):
  """Worker 1 runs out after 3 steps, or has half batches at step 4."""
  code, log = _launch(tmp_path, uneven, "--steps", "10")
  assert code == 0, log
  results = _results(tmp_path)
  assert int(results[0]["steps"]) == int(results[1]["steps"]) == 3
  for key in results[0]:
    if key.startswith("v"):
      np.testing.assert_array_equal(results[0][key], results[1][key])


def _waited(out) -> float:
  """The seconds of a worker's `WAITED` line: how long its constructor took."""
  waited = re.search(r"WAITED (\S+)", out)
  assert waited, out
  return float(waited.group(1))


def test_a_worker_that_never_joins_is_named_within_the_join_timeout():
  """Worker 1's port is taken: it cannot start; worker 0 waits 10 x timeout_s."""
  import socket  # pylint: disable=g-import-not-at-top
  from replicator import launch  # pylint: disable=g-import-not-at-top
  with socket.socket() as busy:
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    addresses = [f"127.0.0.1:{launch.free_ports(1)[0]}",
                 f"127.0.0.1:{busy.getsockname()[1]}"]
    # The failed replicator stays referenced (by the traceback): a later
    # checkpoint must not take it for a cluster to wait on.
    code = ("import sys, tempfile, time, tensorflow as tf, replicator\n"
            "began = time.monotonic()\n"
            "try:\n"
            "  replicator.MultiGpuReplicator("
            "all_reduce=replicator.AllReduceOptions(timeout_s=0.5))\n"
            "except TimeoutError as error:\n"
            "  failed = error\n"
            "  print(f'WAITED {time.monotonic() - began:.1f}', flush=True)\n"
            "  print(f'TimeoutError: {error}', flush=True)\n"
            "  path = replicator.Checkpointer(tempfile.mkdtemp(), "
            "v=tf.Variable(1.0)).save(3)\n"
            "  print('saved', path, flush=True)\n"
            "  sys.exit(1)\n")
    procs = [subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, env=dict(os.environ, TF_CONFIG=json.dumps(
            {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": i}})))
             for i in range(2)]
    try:
      outs = [p.communicate(timeout=HANG_S)[0] for p in procs]
    finally:
      for p in procs:
        p.kill()
        p.wait()
  assert procs[0].returncode != 0 and procs[1].returncode != 0, outs
  # The constructor waited the join timeout (5 s), not the default's 10 minutes.
  assert _waited(outs[0]) < _JOINED_WITHIN_S, outs[0]
  assert (f"TimeoutError: cluster: worker 0 waited 5 s (10 x AllReduceOptions.timeout_s) "
          f"and worker(s) 1 ({addresses[1]}) did not join") in outs[0], outs[0]
  assert "saved /" in outs[0] and "ckpt-3-" in outs[0], outs[0]
  assert (f"RuntimeError: cluster: worker 1 could not start its gRPC server on "
          f"{addresses[1]}") in outs[1], outs[1]


@pytest.mark.slow
def test_a_replicator_made_on_the_chief_alone_is_named_within_the_join_timeout():
  """Each replicator takes a collective group of its own, in order: a worker that
  made one more before the common one waits for peers that never join it."""
  from replicator import launch  # pylint: disable=g-import-not-at-top
  # The replicators that do meet wait as long as a loaded machine takes to
  # start both workers; the chief's second one waits 5 s.
  code = ("import json, os, time, replicator\n"
          "worker = json.loads(os.environ['TF_CONFIG'])['task']['index']\n"
          "patient = replicator.AllReduceOptions(timeout_s=60)\n"
          "options = replicator.AllReduceOptions(timeout_s=0.5)\n"
          "try:\n"
          "  if worker == 0:\n"
          "    evaluation = replicator.MultiGpuReplicator(all_reduce=patient)\n"
          "    began = time.monotonic()\n"
          "    training = replicator.MultiGpuReplicator(all_reduce=options)\n"
          "  else:\n"
          "    training = replicator.MultiGpuReplicator(all_reduce=patient)\n"
          "  print('MADE', flush=True)\n"
          "  time.sleep(3600)\n"
          "except TimeoutError as error:\n"
          "  print(f'WAITED {time.monotonic() - began:.1f}', flush=True)\n"
          "  print(f'TimeoutError: {error}', flush=True)\n")
  procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
           for env in launch.worker_environments(2, devices_per_worker=1)]
  try:
    out = procs[0].communicate(timeout=HANG_S)[0]
  finally:
    for p in procs:
      p.kill()
      p.wait()
  # The constructor waited the join timeout (5 s), not the default's 10 minutes.
  assert _waited(out) < _JOINED_WITHIN_S, out
  assert ("TimeoutError: cluster: worker 0's MultiGpuReplicator (number 2 of this "
          "process's) waited 5 s for the other workers' and they did not join") in out, out
  assert "MADE" not in out, out


def _run_workers(script_args, timeout_s=HANG_S, workers=2, wait_for=(0,),
                 script="lose_worker.py"):
  """Starts workers directly (no launcher); returns [(code, output)] of `wait_for`."""
  from replicator import launch  # pylint: disable=g-import-not-at-top
  script = os.path.join(os.path.dirname(__file__), script)
  procs = [subprocess.Popen([sys.executable, script, *script_args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for env in launch.worker_environments(workers, devices_per_worker=1)]
  try:
    results = []
    for w in wait_for:
      out, _ = procs[w].communicate(timeout=timeout_s)
      results.append((procs[w].returncode, out))
    return results
  finally:
    for p in procs:
      p.kill()
      p.wait()


# lose_worker.py's AllReduceOptions.timeout_s: a peer is lost after half of it
# without an answer.
_LOSE_TIMEOUT_S = 10
# The longest that a survivor's Python may stand still meanwhile: one heartbeat
# check that waited for the silent peer as long as the silence allowed would
# stop every thread for _LOSE_TIMEOUT_S / 2; the checks wait 0.5 s each.
_STALL_S = 2.0


def _lost_line(out, how, stalled=False):
  """A survivor's `LOST` line, checked for how the loss was noticed.

  Killed, the peer refuses the heartbeat's next check (each second), and the
  verdict says so: it does not wait out a silence. Frozen, the peer is lost
  after _LOSE_TIMEOUT_S / 2 without an answer, as the verdict says, and before
  _LOSE_TIMEOUT_S. Also how long the survivor's Python stood still (`STALL`),
  unless the test `stalled` it.
  """
  line = next((l for l in out.splitlines() if l.startswith("LOST")), None)
  assert line, out
  if how.startswith("kill"):
    assert "its server refused a health check" in line, line
  else:
    silent = re.search(r"no answer to health checks for (\d+) s", line)
    assert silent, line
    assert _LOSE_TIMEOUT_S / 2 <= int(silent.group(1)) < _LOSE_TIMEOUT_S, line
  stall = next(l for l in out.splitlines() if l.startswith("STALL"))
  assert stalled or float(stall.split()[1]) < _STALL_S, stall
  return line


@pytest.mark.slow
@pytest.mark.parametrize("how", ["kill", "freeze"])
def test_a_lost_worker_makes_the_other_raise_worker_lost(how):
  [(code, out)] = _run_workers(["--how", how, "--timeout_s", str(_LOSE_TIMEOUT_S)])
  assert code == 3, out
  line = _lost_line(out, how)
  assert "worker 1 (127.0.0.1:" in line, line
  assert "after step 5" in line or "after step 4" in line, line  # see lose_worker.py


@pytest.mark.slow
@pytest.mark.parametrize("how", ["kill", "freeze"])
def test_a_worker_lost_before_the_first_step_is_named_by_every_survivor(how):
  """3 workers; worker 2 dies or freezes before the step that syncs new variables.

  Killed, its port refuses the next heartbeat (each second); frozen, it is lost
  after timeout_s / 2 (5 s) without an answer. The survivor that reports first
  leaves; the other still names worker 2, never the survivor that left.
  """
  results = _run_workers(["--how", f"{how}_before_first_run",
                          "--timeout_s", str(_LOSE_TIMEOUT_S)],
                         workers=3, wait_for=(0, 1))
  for code, out in results:
    assert code == 3, out
    line = _lost_line(out, how)
    assert "worker 2 (127.0.0.1:" in line and "after step 0" in line, line


@pytest.mark.slow
def test_a_survivor_held_back_names_the_lost_worker_not_the_one_that_left(tmp_path):
  """3 workers; worker 2 stops worker 1 for 4 s (as a loaded machine may hold a
  process back), then dies before the first step.

  Worker 0 names worker 2 at once and leaves; had it left before worker 1 ran
  again, worker 1 would find two workers down. A survivor stays 6 s (5 heartbeat
  intervals and 0.5 s a peer) after its verdict, so worker 1 still sees worker 0
  answer after worker 2 refused, and names worker 2 too.
  """
  results = _run_workers(["--how", "kill_before_first_run", "--timeout_s",
                          str(_LOSE_TIMEOUT_S), "--stall_s", "4", "--pids", str(tmp_path)],
                         workers=3, wait_for=(0, 1))
  for w, (code, out) in enumerate(results):
    assert code == 3, out
    line = _lost_line(out, "kill", stalled=w == 1)
    assert "worker 2 (127.0.0.1:" in line and "after step 0" in line, line


def test_synchronized_batch_norm_between_workers_merges_its_averages_at_the_end():
  """Workers (whose kernels may round differently on another CPU) each combine
  the gathered statistics themselves, so the moving averages are merged, at
  the step's end, in one all-reduce, and the workers hold the same bits."""
  sys.path.insert(0, os.path.dirname(__file__))
  import unlike  # pylint: disable=g-import-not-at-top
  results = _run_workers([], wait_for=(0, 1), script="unlike.py")
  lines = [re.search(r"UNLIKE (\[.*?\]) (\S+) (.*)", out) for _, out in results]
  assert all(lines), results
  # the hidden and debiased averages of the mean and the variance (4 tensors),
  # then their step counters (2 integers, the chief's)
  assert json.loads(lines[0].group(1)) == [4, 2], results
  assert lines[0].group(2) == lines[1].group(2), results  # the same bits
  hidden = np.zeros(unlike.CHANNELS)
  batches = [unlike.data(w).reshape(unlike.STEPS, unlike.BATCH, -1) for w in (0, 1)]
  for step in range(unlike.STEPS):  # the global batch's mean, Sonnet's debiased EMA
    mean = np.concatenate([b[step] for b in batches]).mean(0)
    hidden -= (hidden - mean) * (1 - unlike.DECAY)
  np.testing.assert_allclose(json.loads(lines[0].group(3)),
                             hidden / (1 - unlike.DECAY ** unlike.STEPS), rtol=1e-5)


def test_misuses_raise_the_true_error_on_every_worker(tmp_path):
  """Different `steps` on two workers (a hang before), a step that fails on
  every worker (reported as WorkerLost before) and checkpoint directories that
  are not shared (different states restored before) raise the true error."""
  results = _run_workers(["--ckpt", str(tmp_path / "ckpt")], wait_for=(0, 1),
                         script="agree.py")
  # A float update every worker computes alike from its copies: merged all
  # the same (nothing assumes the workers round alike), the same bits on both.
  alike = [re.search(r"ALIKE (\S+) (.*)", out) for _, out in results]
  assert all(alike), results
  assert alike[0].group(1) == alike[1].group(1), results
  np.testing.assert_allclose(json.loads(alike[0].group(2)),
                             np.array([0.5, 0.25]) / (1 - 0.9 ** 3), rtol=1e-6)
  dtypes = [re.search(r"DTYPES (.*) (\S+) (\[.*\])$", out, re.M) for _, out in results]
  assert all(dtypes), results  # the chief's values, bit for bit, in every dtype
  assert dtypes[0].group(1) == dtypes[1].group(1), results
  assert [d.group(2, 3) for d in dtypes] == [("1.5", "[0, 1]")] * 2, results
  lazy = [re.search(r"LAZY_THEN (.*)", out) for _, out in results]
  assert all(lazy) and lazy[0].group(1) == lazy[1].group(1), results  # the chief's
  for w, (code, out) in enumerate(results):
    assert code == 0 and "DONE" in out, out
    lines = {l.split()[0]: l for l in out.splitlines() if l[:1].isupper()}
    # Without input the first step runs while the workers compare `steps`.
    assert f"called run(step_fn, steps={1 + w}) and another worker asked for a " \
        "different number of steps, so only the first step ran, on every worker" \
        in lines["STEPS"], out
    assert lines["AFTER"] == "AFTER [10.0, 10.0, 10.0]", out  # 1 + 1 + 3 steps, 2 workers
    # With input no step runs: the one-step function (worker 0) and the loop
    # (worker 1) compare `steps` in their first fetch, under one key; the
    # refused call's batches (0 and 100) are not run. Then the loop, traced
    # at different times on the two workers, pairs its collectives.
    assert f"called run(sum_of_batches, steps={1 + w}) and another worker asked " \
        "for a different number of steps, so no step ran" in lines["INPUT_STEPS"], out
    assert lines["INPUT_LOOPS"] == f"INPUT_LOOPS {w}", out  # one step: no loop
    assert lines["INPUT_AFTER"] == "INPUT_AFTER [104.0] 1", out  # (2 + 102): the second step
    assert lines["NUMERICS"] == "NUMERICS InvalidArgumentError", out
    # an extra collective on the chief: an error on each worker, then steps run on
    traced = re.search(r"BRANCH step_fn: branching_fn traced (\d+) cross-worker "
                       rf"collective\(s\) on worker {w} and from (\d+) to (\d+) on "
                       "the workers, so they would wait", lines["BRANCH"])
    assert traced, out
    fewest, most = int(traced.group(2)), int(traced.group(3))
    assert most == fewest + 1 and int(traced.group(1)) == (most if w == 0 else fewest), out
    assert lines["THEN"] == "THEN [14.0, 14.0, 14.0]", out  # v: 6 after NUMERICS, then 7
    # the same in the trace that builds a model: the error, then the chief's values
    assert lines["LAZY"] == "LAZY ProgramsDiffer", out
    # the other worker computed no drawn value: snt.Linear's w (its b is zeros)
    assert lines["LAZY_LEFT"] == f"LAZY_LEFT {w}", out
    # ... and where the chief's did not come (the variables differ), computes it:
    # every copy holds it, a draw, not zeros
    assert lines["OWN"] == "OWN ProgramsDiffer", out
    assert lines["OWN_WHOLE"] == f"OWN_WHOLE {w} True True [0.0, 0.0]", out
    # a variable made on the chief alone: an error on each worker, nothing sent
    assert (f"EXTRA step_fn: chief_variable_fn: worker {w} made {1 if w == 0 else 0} "
            "variable(s) in its first run or in repl.context() since the last run "
            f"({'float32(2,)' if w == 0 else ''}), and the workers from 0 to 1 or "
            "other ones") in lines["EXTRA"], out
    assert lines["EXTRA_THEN"] == "EXTRA_THEN [14.0, 14.0, 14.0]", out
    # the same made in repl.context() before a new step (a raw shape error before)
    assert (f"CONTEXT step_fn: context_fn: worker {w} made {1 if w == 0 else 0} "
            "variable(s) in its first run or in repl.context() since the last run "
            f"({'float32(3,)' if w == 0 else ''})") in lines["CONTEXT"], out
    assert lines["CONTEXT_THEN"] == "CONTEXT_THEN [14.0, 14.0, 14.0]", out
    # every write merged at the step's end: one merge for each all_sum, then
    # the float means in one all-reduce and the integers (snt.BatchNorm's
    # counters among them) in another, which take the chief's values (from a
    # sum minus the worker index, from the replica id); counter 3, doubled
    # 0 -> 1 -> 4 -> 11
    assert lines["COUNTING"] == ("COUNTING ['all_reduce', 'all_reduce', 'all_reduce', "
                                 "'all_reduce'] 3 11 1 5 0.5"), out
    # a variable read after its write where it matters (the step's output):
    # traced again, merged at the write, so both workers return 2 * 1.5
    assert lines["REREAD"] == "REREAD [3.0] 1.5", out
    # ... and where a Python number differs between workers: the integer
    # takes the chief's value on every worker (3 + 1), as the replica id's did
    assert lines["PER_WORKER"] == "PER_WORKER ran", out
    assert lines["PER_WORKER_THEN"] == "PER_WORKER_THEN 4 [20.0, 20.0, 20.0]", out
    # ... and before a step traced before: compared in its call, an error on each
    assert (f"CONTEXT_OLD repl.context(): this worker made {1 if w == 0 else 0} "
            f"variable(s) since its last run ({'float32(4,)' if w == 0 else ''}) and "
            "another worker other ones") in lines["CONTEXT_OLD"], out
    assert "of run(sum_fn, steps=1), only the first step ran" in lines["CONTEXT_OLD"], out
    # the same variables everywhere, then a step traced before: sent after it
    assert lines["CONTEXT_SHARED"] == "CONTEXT_SHARED [14.0, 14.0, 14.0] [10.0, 10.0]", out
    # initial values alike on every worker stay home; the others are the chief's
    # (sent: the 3 values that differ, broadcast; not the 5000 zeros)
    assert lines["ALIKE_SENT"] == "ALIKE_SENT True True 0.0 [1.0, 1.0, 1.0]", out
    # as many collectives but other shapes: the error, and collectives still work
    # (listed as traced: the step's first, then the loop's check of `steps`,
    # the pending variables and the interrupt flag)
    assert (f"SHAPES step_fn: shapes_fn traced collectives of other dtypes or shapes "
            f"on other workers (this worker, {w}: Add float32[{2 if w == 0 else 3}]; "
            "Min int64[2, 3])") in lines["SHAPES"], out
    assert lines["STILL"] == "STILL [16.0, 16.0, 16.0]", out
    # a batch dim static on one worker and not the other: not another program
    assert lines["MIXED"] == "MIXED [0.0, 1.0, 10.0, 11.0] [10.0, 12.0]", out
    # ... whose size then differs at run time (step 2: 2 and 1 elements); the
    # gradient: 2 workers' losses weigh each element by its position
    assert lines["STATIC"] == ("STATIC [2.0, 3.0, 2.0] [2.0, 4.0]" if w == 0
                               else "STATIC [2.0, 3.0, 2.0] [6.0]"), out
    assert lines["AGAIN"] == "AGAIN [18.0, 18.0, 18.0]", out
    assert lines["COLLIDE"] == "COLLIDE [2048. 2050.]", out
    assert lines["COLLIDE2"] == "COLLIDE2 [976. 978.]", out
    assert lines["COLLIDE3"] == "COLLIDE3 (7, 123) [4.0]", out
    assert lines["UNKNOWN_RANK"] == "UNKNOWN_RANK (7, 123) [4.0]", out
    assert lines["SWAPPED"] == "SWAPPED True", out
    # step 3: [0, 1] and [0, 1, 2] on each worker, a sum of 4 each
    assert lines["RAGGED"] == "RAGGED [2, 3, 2, 3] 8", out
    assert lines["UNIFORM"] == "UNIFORM 8", out  # step 3: 0 + 1 and 0 + 1 + 2, twice
    assert lines["SPARSE"] == "SPARSE [0, 6, 0, 6]", out
    assert lines["EMPTY"] == "EMPTY (1, 0, 3)", out
    assert lines["EMPTY_COLUMNS"] == "EMPTY_COLUMNS (1, 4, 0) (1, 5, 0)", out
    # a reduction of values whose shapes differ at run time: an error on each
    assert lines["REDUCE"] == "REDUCE True", out
    assert lines["WIDE"] == "WIDE True", out
    assert lines["ONWARD"] == "ONWARD [20.0, 20.0, 20.0]", out
    # save waits for the chief: restore_latest right after finds its checkpoint
    assert lines["CKPT"] == "CKPT [1, 2]", out
    # unshared directories: an error on every worker, not two different states
    assert (f"UNSHARED directory: the workers see different newest checkpoints in "
            f"'{tmp_path / 'ckpt'}_{w}' (this worker, {w}: "
            f"{'step 3' if w == 0 else 'none'}; from none to step 3") in lines["UNSHARED"], out
