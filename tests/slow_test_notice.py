"""A pytest plugin: a line on the terminal while a test runs long.

pytest-xdist reports a test when it ends, so while one file's long test
(or its class's set-up) runs, the README's test command
(`pytest -q -n 3 --dist loadfile`) shows nothing: one run sat at "[98%]"
for 329 s. This plugin runs where the tests are reported: in the xdist
controller, which hears from its workers when each test starts
(`pytest_runtest_logstart`) and ends (`pytest_runtest_logfinish`). A timer
thread writes a line naming each test still running once it has run
`every_s` seconds, and again every `every_s` seconds after:

  [still running after 45 s: tests/trainer_sharded_test.py::...::testX]

A test process that captures its tests' output (one process without
`-s`) gets no plugin: its lines would land in a test's captured output.
The seconds come from $CADENCE_TEST_NOTICE_S (default 45).

Example (tests/conftest.py):
  def pytest_configure(config):
    slow_test_notice.Register(config)
"""
import os
import threading
import time

ENV = 'CADENCE_TEST_NOTICE_S'
DEFAULT_EVERY_S = 45.0


def IsXdistController(config):
  """Whether this process is pytest-xdist's controller: it hands the tests
  to its workers and reports them, running none (xdist's own test, made
  before its plugin exists)."""
  return (not hasattr(config, 'workerinput') and
          getattr(config.option, 'dist', 'no') != 'no' and
          bool(getattr(config.option, 'tx', None)) and
          not config.getoption('collectonly', False))


def Wanted(config):
  """Whether this process reports tests on a terminal it may write to while
  they run: the xdist controller, or one process that captures nothing."""
  if hasattr(config, 'workerinput'):   # An xdist worker.
    return False
  return (IsXdistController(config) or
          config.getoption('capture', 'fd') == 'no')


def Register(config):
  """Registers the plugin with `config` where `Wanted`; returns it or None."""
  if not Wanted(config):
    return None
  plugin = SlowTestNotice(float(os.environ.get(ENV, DEFAULT_EVERY_S)))
  config.pluginmanager.register(plugin, 'cadence_slow_test_notice')
  return plugin


class SlowTestNotice:
  """Names the tests that have been running for `every_s` seconds, every
  `every_s` seconds, on the terminal reporter's writer (none without a
  terminal reporter).

  Args:
    every_s: seconds between a test's start and its first line, and
      between its lines.
    poll_s: how often the timer thread looks.
  """

  def __init__(self, every_s, poll_s=1.0):
    self._writer = None
    self._every_s = every_s
    self._poll_s = min(poll_s, every_s / 4)
    self._lock = threading.Lock()
    self._running = {}   # nodeid -> [start time, next notice time]
    self._stop = threading.Event()
    self._thread = None

  def pytest_sessionstart(self, session):
    if not session.config.pluginmanager.hasplugin('terminalreporter'):
      return
    self._writer = session.config.get_terminal_writer()
    self._thread = threading.Thread(target=self._Watch, daemon=True,
                                    name='slow_test_notice')
    self._thread.start()

  def pytest_sessionfinish(self, session):
    del session
    self._stop.set()
    if self._thread is not None:
      self._thread.join()

  def pytest_runtest_logstart(self, nodeid, location):
    del location
    now = time.monotonic()
    with self._lock:
      self._running[nodeid] = [now, now + self._every_s]

  def pytest_runtest_logfinish(self, nodeid, location):
    del location
    with self._lock:
      self._running.pop(nodeid, None)

  def Due(self, now):
    """[(nodeid, seconds running)] of the tests due a line at `now`; each
    one's next line is then `every_s` later."""
    due = []
    with self._lock:
      for nodeid, times in self._running.items():
        if now >= times[1]:
          due.append((nodeid, now - times[0]))
          times[1] += self._every_s
    return due

  def _Watch(self):
    while not self._stop.wait(self._poll_s):
      for nodeid, seconds in self.Due(time.monotonic()):
        if self._writer.width_of_current_line:
          self._writer.line()   # After the progress letters of the line.
        self._writer.line(f'[still running after {seconds:.0f} s: {nodeid}]')
        self._writer.flush()
