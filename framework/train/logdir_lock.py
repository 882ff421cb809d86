"""One writer per logdir: an OS lock the kernel releases when its holder dies.

Two trainers on one logdir would both write the same checkpoint files. The
trainer (the chief host of several) takes `WriterLock(logdir)` before it
writes anything there; a second one gets `HeldError` naming the holder
(host, pid, start time and command line, which the holder writes into the
lock file). Evalers and decoders only read the checkpoints: they take no
lock.

The lock is `fcntl.flock` on `logdir/.writer.lock`: the kernel drops it
when the holder's process ends, however it ends, so a SIGKILLed run never
blocks its restart (the file it leaves names a dead holder, and the next
one simply takes it). A clean `Release` deletes the file, so a logdir
whose runs all ended cleanly holds none, and the logdir too if the lock
created it and it is still empty (a run refused at start leaves nothing).
flock is local to a machine (and on NFS depends on the client); hosts
sharing a logdir over a network file system must not rely on it.

Example:
  lock = WriterLock('/tmp/run')        # raises HeldError if it is held
  try:
    ...                                # train, write checkpoints
  finally:
    lock.Release()
"""
import datetime
import errno
import fcntl
import json
import os
import socket
import sys
import time

LOCK_FILE = '.writer.lock'


class HeldError(Exception):
  """Another live process holds the logdir's writer lock."""


def _Holder():
  """What the lock file says of this process."""
  started = datetime.datetime.now(datetime.timezone.utc)
  return dict(host=socket.gethostname(), pid=os.getpid(),
              start=started.strftime('%Y-%m-%d %H:%M:%S UTC'),
              argv=' '.join(sys.argv))


def _ReadHolder(fd, wait_secs=1.0):
  """The holder's record from the lock file `fd` (the holder writes it just
  after locking: wait up to `wait_secs` for it), or None."""
  deadline = time.monotonic() + wait_secs
  while True:
    os.lseek(fd, 0, os.SEEK_SET)
    data = os.read(fd, 1 << 16)
    try:
      return json.loads(data.decode('utf-8'))
    except ValueError:  # Being written, or not ours.
      if time.monotonic() > deadline:
        return None
      time.sleep(0.02)


def Describe(holder):
  """'host h, pid 12, started 2025-01-02 03:04:05 UTC' of a lock record."""
  if not holder:
    return 'a process that has not said who it is'
  return (f"host {holder.get('host')}, pid {holder.get('pid')}, started "
          f"{holder.get('start')}")


def _Held(logdir, path, holder):
  return HeldError(
      f'--logdir {logdir} is in use by another trainer ({Describe(holder)}; '
      f'lock file {path}): one logdir has one writer. Wait for it to end (or '
      'stop it), or use another --logdir.')


def CheckFree(logdir):
  """Raises HeldError if a live process holds the writer lock of `logdir`.

  Reads only: no file or folder is created (the trainer asks before
  TensorFlow loads, so a busy logdir is refused in well under a second;
  `WriterLock` takes the lock later, before the first write).
  """
  path = os.path.join(logdir, LOCK_FILE)
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError:   # No lock file (or none readable): nobody holds it.
    return
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
      if e.errno not in (errno.EAGAIN, errno.EACCES):
        raise
      raise _Held(logdir, path, _ReadHolder(fd)) from None
    fcntl.flock(fd, fcntl.LOCK_UN)
  finally:
    os.close(fd)


class WriterLock:
  """The writer lock of `logdir`, held from construction until `Release`.

  Args:
    logdir: the folder (created if missing).

  Raises:
    HeldError: another process holds it; the message names it and the
      lock file.
    OSError: the lock file cannot be created (an unwritable logdir).
  """

  def __init__(self, logdir):
    self._created = not os.path.isdir(logdir)
    os.makedirs(logdir, exist_ok=True)
    self.path = os.path.join(logdir, LOCK_FILE)
    while True:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except OSError as e:
        if e.errno not in (errno.EAGAIN, errno.EACCES):
          os.close(fd)
          raise
        holder = _ReadHolder(fd)
        os.close(fd)
        raise _Held(logdir, self.path, holder) from None
      # A holder releasing deletes the file: if it did so between our open
      # and our lock, we hold a deleted file; open the new one instead.
      try:
        same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
      except FileNotFoundError:
        same = False
      if same:
        break
      os.close(fd)
    self._fd = fd
    self.holder = _Holder()
    os.ftruncate(fd, 0)
    os.write(fd, (json.dumps(self.holder) + '\n').encode('utf-8'))

  @property
  def held(self):
    return self._fd is not None

  def Release(self):
    """Deletes the lock file and unlocks it (and removes the logdir if the
    lock created it and it is empty); a no-op once released."""
    if self._fd is None:
      return
    try:
      os.remove(self.path)
    except FileNotFoundError:
      pass
    os.close(self._fd)  # Closing the last descriptor unlocks.
    self._fd = None
    if self._created:
      try:
        os.rmdir(os.path.dirname(self.path))
      except OSError:   # Not empty: the run wrote there.
        pass

  def __enter__(self):
    return self

  def __exit__(self, *unused_exc):
    self.Release()
