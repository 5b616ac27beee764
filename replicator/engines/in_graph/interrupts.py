"""Ctrl-C (SIGINT) and SIGTERM during a call of several steps.

A call of `steps=k` is one compiled TensorFlow call, and Python runs a signal's
handler on the main thread only, once that call returns: a `KeyboardInterrupt`
would wait for every step. So once such a call is traced, a `Hold` records
these signals instead, and a helper thread watching Python's wakeup fd
(`signal.set_wakeup_fd`, written by the C-level handler on whichever thread
the signal reaches) writes each one's number to the call's `StopFlag`, which
the compiled loop reads before each next step: the loop ends between two steps
with the status `fetch.StepStatus.INTERRUPTED` minus that number. The call
stays on the thread that made it (its device scopes, its summary writer). Once
its steps are counted, `Hold.release` raises each held signal again, so the
process's own handler runs as it would have (`KeyboardInterrupt` for Ctrl-C by
default, a preemption handler's flag or exit for SIGTERM).

On several workers every worker stops at the same step (else the others would
wait at the next step's collectives; `CompiledStep._trace_loop` says how), and
each handles the signal as if it had got it, so that all leave `run` alike.

A signal whose disposition is not a Python function is not held: with its
default action SIGTERM still ends the process at once, and an ignored one
stays ignored.
"""

import os
import signal
import socket
import threading

import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

# The signals that end a call between two steps.
INTERRUPTING = (signal.SIGINT, signal.SIGTERM)
# Steps between two comparisons of the workers' flags in a loop without input
# (with input, the fetch of every step compares them): a small collective
# beside every step would cost more than the bound on steps it buys.
AGREE_EVERY = 8


class StopFlag:
  """A host variable the loop of one compiled step reads before each next step.

  0 while the steps may go on, else the number of the signal that stops them.
  It is a variable of no replicator (made outside the variable creator scopes,
  read by handle), so the step's check that every variable it uses is
  replicated does not see it.
  """

  def __init__(self):
    with tf.init_scope(), tf.device("/device:CPU:0"):
      self._variable = resource_variable_ops.ResourceVariable(
          tf.constant(0, tf.int64), trainable=False, name="replicator_stop_signal")

  def signal(self, after=()) -> tf.Tensor:
    """The flag, read in the compiled loop (after the ops `after`): an int64 scalar.

    Reads are not ordered among themselves: one after the loop must name it.
    """
    with tf.control_dependencies(after):
      return tf.raw_ops.ReadVariableOp(resource=self._variable.handle, dtype=tf.int64)

  def set(self, signum: int):
    self._variable.assign(signum)


class _Watcher:
  """The thread that sets the armed call's flag when a held signal arrives.

  Python's C-level handler writes each signal's number to the wakeup fd; the
  bytes are passed on to the fd that was there before (an asyncio loop's,
  say), whose reader expects them.
  """

  def __init__(self):
    self._lock = threading.Lock()
    self._flag = None  # the armed call's StopFlag
    self.stopped = False  # whether the armed call's flag was set
    self.forward_to = -1  # the wakeup fd in place before the armed call
    self._reader, self.writer = socket.socketpair()
    self.writer.setblocking(False)
    threading.Thread(target=self._watch, name="replicator-signal-watcher",
                     daemon=True).start()

  def arm(self, flag: StopFlag):
    with self._lock:
      self._flag, self.stopped = flag, False

  def disarm(self) -> bool:
    """Whether the flag was set; afterwards no signal sets it."""
    with self._lock:
      self._flag, stopped, self.stopped = None, self.stopped, False
    return stopped

  def _watch(self):
    while True:
      numbers = self._reader.recv(64)
      with self._lock:
        if self.forward_to != -1:
          try:
            os.write(self.forward_to, numbers)
          except OSError:  # full or closed: as Python's own write, best effort
            pass
        held = [number for number in numbers if number in INTERRUPTING]
        if self._flag is not None and not self.stopped and held:
          self._flag.set(held[0])
          self.stopped = True


_watcher = None


def _forget_watcher():
  global _watcher
  _watcher = None  # a forked child has no thread behind it


os.register_at_fork(after_in_child=_forget_watcher)


class Hold:
  """From `start` to `release`, SIGINT and SIGTERM end `flag`'s loop between steps.

  Their handlers run at `release`, after what came before it (counting the
  steps that ran); one that raises (`KeyboardInterrupt`) raises from there.
  Off the main thread, or where neither signal has a Python handler, nothing
  is held.
  """

  def __init__(self, flag: StopFlag):
    self._flag = flag
    self._handlers = {}  # signal -> the handler it had before `start`
    self._caught = []  # the held signals that arrived, in order
    self._released = False
    self._previous_fd = None  # the wakeup fd before `start`

  def start(self):
    global _watcher
    if threading.current_thread() is not threading.main_thread():
      return
    handlers = {s: signal.getsignal(s) for s in INTERRUPTING}
    self._handlers = {s: h for s, h in handlers.items() if callable(h)}
    if not self._handlers:
      return
    if _watcher is None:
      _watcher = _Watcher()
    _watcher.arm(self._flag)
    # The wakeup fd first: a signal from here on stops the loop.
    self._previous_fd = signal.set_wakeup_fd(_watcher.writer.fileno(),
                                             warn_on_full_buffer=False)
    _watcher.forward_to = self._previous_fd
    for s in self._handlers:
      signal.signal(s, self._record)

  def _record(self, signum, frame):
    if self._released:  # left in place by a signal during `release`: pass it on
      self._handlers[signum](signum, frame)
    elif signum not in self._caught:
      self._caught.append(signum)

  def release(self, also: int = 0):
    """Puts the handlers back, then raises each held signal again.

    `also`: a signal that stopped the loop (0: none); one that reached another
    worker only is raised here too, so every worker handles it as if it had
    got it (unless it ignores it).
    """
    if self._handlers:
      if self._previous_fd is not None:
        signal.set_wakeup_fd(self._previous_fd)
      if _watcher is not None and _watcher.disarm():
        self._flag.set(0)
      self._released = True
      for s, handler in self._handlers.items():
        signal.signal(s, handler)
    if also and also not in self._caught and signal.getsignal(also) != signal.SIG_IGN:
      self._caught.append(also)
    # Each delivered again, to the handlers now in place. Where one raises, the
    # later signals are sent to the main thread, whose handlers then run as
    # Python runs several pending ones.
    for index, signum in enumerate(self._caught):
      try:
        signal.raise_signal(signum)
      except BaseException:
        for later in self._caught[index + 1:]:
          signal.pthread_kill(threading.main_thread().ident, later)
        raise
