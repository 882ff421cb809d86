"""`trainer.py --mode=export`: a trained task as a SavedModel for serving.

  python trainer.py --model=lm.one_billion_wds.OneBWdsGPipeTransformerTiny \
      --logdir=/tmp/cadence_lm --mode=export
  # -> /tmp/cadence_lm/export/<step>, loaded by tf.saved_model.load

`Export` restores a checkpoint of `logdir/train` (the latest, or the one
asked for) into the task built for inference, and writes the task's
`Inference()` graph (framework/inference.py) as a SavedModel:

  * signatures: one tf.function per signature, its inputs named as the
    task names them, called with the restored weights (the EMA weights
    when the run keeps an EMA, as the evaler does); each is also a
    serving signature (`loaded.signatures[name]`, TF Serving) and an
    attribute (`loaded.score(ids=..., paddings=...)`). Their documentation
    is written to `assets.extra/signatures.txt` beside the model;
  * assets: the files the graph needs (the LM's SentencePiece model), as
    `loaded.<name>.asset_path`;
  * a Keras task's model is exported by Keras (`keras.Model.export`).

The task is built with is_inference=True on one device, of a cluster whose
device scope places nothing (`_Unplaced`): the graph carries no device
names, so the process that loads it places it (on its GPU, or CPU). A
pipelined model exports its inference computation: a PipeliningLayer with
is_inference and one device runs its cells one after the other on the
whole batch (layers/gpipe.py); micro-batches and stage devices are a
training layout and are not in the graph.

The export is written whole or not at all: into a fresh folder beside the
target, then renamed into place. A failure (or a kill) leaves the target as
it was; an existing export at the target is replaced only by a complete
one (moved aside, the new one renamed in, the old one deleted), and a
target that exists but is not a SavedModel is never touched. A kill
leaves at most hidden folders beside the target: `.<name>.tmp-*` (a
partial export), or, between the two renames of a replacement, the old
export whole in `.<name>.old-*` and the new one whole in `.<name>.tmp-*`.

Export reads the logdir like an evaler: it takes no lock and moves no
damaged checkpoint aside. Its errors (no checkpoint, an unreadable one, an
unwritable or occupied target, a task without `Inference`, bad shapes) are
`ExportError`s, which the trainer prints as one line and exits 2. A
SIGTERM or SIGINT while it works removes the partial folder (the target
stays as it was) and raises `Interrupted`: the trainer prints one line and
exits 4 (nothing written; rerun the command); a second signal ends the
process at once.
"""
import contextlib
import inspect
import os
import signal
import threading
import time
import uuid

from absl import logging
import tensorflow as tf

from cadence.framework import atomic_file
from cadence.framework import base_model
from cadence.framework import cluster as cluster_lib
from cadence.framework import validation
from cadence.framework.jobs import checkpoint_fit
from cadence.framework.train import checkpoint_files
from cadence.framework.train import checkpointer
from cadence.framework.train import eval_programs

_DOC_FILE = os.path.join('assets.extra', 'signatures.txt')


class ExportError(Exception):
  """A user error of an export: the trainer's exit 2, one line."""


class Interrupted(Exception):
  """SIGTERM or SIGINT stopped the export; nothing was written."""


@contextlib.contextmanager
def _StopOnSignal():
  """SIGTERM/SIGINT while an export is written raise `Interrupted` where
  the main thread is, so `_WholeOrNothing` removes the partial folder; the
  first signal also restores the default actions, so a second one ends the
  process at once. Only in the main thread (where Python runs handlers)."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  previous = {}

  def _Raise(signum, unused_frame):
    for s in previous:
      signal.signal(s, signal.SIG_DFL)
    raise Interrupted(signal.Signals(signum).name)

  for s in (signal.SIGTERM, signal.SIGINT):
    previous[s] = signal.signal(s, _Raise)
  try:
    yield
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)


def _Unplaced():
  """A one-device cluster whose device scope places nothing.

  Its device is a replica's logical core 0, which off a TPU strategy is
  a no-op scope (cluster.DeviceScope): layers build and run as on one
  device (a pipeline runs its cells in turn) and the traced graph names no
  device.
  """
  return cluster_lib.Cluster.Params().Set(
      devices=[cluster_lib.LogicalCore(0)]).Instantiate()


def _CheckOptions(batch_size, max_len):
  """Raises ExportError for a bad --export_batch_size or --export_max_len."""
  if batch_size is not None and not validation.IsInt(batch_size, 1):
    raise ExportError(f'--export_batch_size={batch_size!r} must be an int '
                      '>= 1 (unset: a dynamic batch).')
  if max_len is not None and not validation.IsInt(max_len, 2):
    raise ExportError(f'--export_max_len={max_len!r} must be an int >= 2 '
                      "(unset: the task's default).")


def _CheckpointPath(train_dir, checkpoint):
  """The checkpoint to export: `checkpoint` (a path or a step number), or
  else the latest; raises ExportError if there is none."""
  paths = checkpointer.ListCheckpoints(train_dir)
  if not paths:
    raise ExportError(f'no checkpoint in {train_dir} to export; train first '
                      '(--mode=sync), or give the --logdir of a trained '
                      'run.')
  if not checkpoint:
    return paths[-1]
  path = checkpoint
  if str(checkpoint).isdigit():
    path = os.path.join(train_dir, f'ckpt-{int(checkpoint)}')
  if not tf.io.gfile.exists(path + '.index'):
    steps = ', '.join(str(checkpointer.StepOf(p)) for p in paths)
    raise ExportError(f'--checkpoint={checkpoint!r}: no checkpoint {path}; '
                      f'{train_dir} holds steps {steps}.')
  return path


def _IsSavedModel(path):
  """Whether `path` is a SavedModel folder."""
  return tf.io.gfile.exists(os.path.join(path, 'saved_model.pb'))


@contextlib.contextmanager
def _WholeOrNothing(target):
  """Yields a fresh folder beside `target`; on success it becomes `target`.

  Raises ExportError if the folder cannot be made, or `target` exists and
  is not a SavedModel. On any exception the fresh folder (and the parent
  folder, if made for it and empty) is removed and `target` is left as it
  was.
  """
  target = target.rstrip('/')
  parent, name = os.path.split(target)
  parent = parent or '.'
  if tf.io.gfile.exists(target) and not _IsSavedModel(target):
    raise ExportError(f'--export_dir: {target} exists and is not a '
                      'SavedModel; not replacing it. Remove it or choose '
                      'another --export_dir.')
  tmp = atomic_file.TempPath(os.path.join(parent, f'.{name}'))
  made_parent = not tf.io.gfile.exists(parent)
  try:
    # Made inside the clean-up: a signal (Interrupted) that comes while it
    # is made, or just after, removes it too.
    try:
      tf.io.gfile.makedirs(tmp)
    except (tf.errors.OpError, OSError) as e:
      raise ExportError(f'--export_dir: cannot write in {parent}: '
                        f'{checkpoint_files.ErrorLine(e)}.') from None
    yield tmp
    if tf.io.gfile.exists(target):
      old = os.path.join(parent, f'.{name}.old-{uuid.uuid4().hex[:8]}')
      tf.io.gfile.rename(target, old)
      tf.io.gfile.rename(tmp, target)
      tf.io.gfile.rmtree(old)
      logging.info('Replaced the export in %s.', target)
    else:
      tf.io.gfile.rename(tmp, target)
  except BaseException:
    if tf.io.gfile.exists(tmp):
      tf.io.gfile.rmtree(tmp)
    if (made_parent and tf.io.gfile.exists(parent) and
        not tf.io.gfile.listdir(parent)):
      tf.io.gfile.rmtree(parent)
    raise


def _Function(signature, theta):
  """A tf.function of the signature's named inputs, theta bound."""
  names = list(signature.inputs)

  def _Call(*args, **kwargs):
    inputs = _Call.__signature__.bind(*args, **kwargs).arguments
    return signature.fn(theta, **inputs)

  _Call.__signature__ = inspect.Signature([
      inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
      for n in names])
  specs = [tf.TensorSpec(s.shape, s.dtype, name=n)
           for n, s in signature.inputs.items()]
  return tf.function(_Call, input_signature=specs, autograph=False)


def _DocText(graph, step, checkpoint_path):
  lines = [graph.doc, f'Weights: {checkpoint_path} (global step {step}).',
           '']
  for sig in graph.signatures.values():
    lines += [sig.doc, '']
  return '\n'.join(lines)


def _Write(graph, theta, path, doc):
  """Saves `graph` with theta's variables into the folder `path`.

  Args:
    graph: an inference.InferenceGraph.
    theta: the task's theta, whose leaves are its variables.
    path: an empty folder.
    doc: the text of assets.extra/signatures.txt.
  """
  if graph.keras_model is not None:
    graph.keras_model.export(path, input_signature=graph.keras_inputs,
                             verbose=False)
  else:
    root = tf.Module()
    root.vars = dict(theta.FlattenItems())   # Tracks what the graph reads.
    for name, asset in graph.assets.items():
      setattr(root, name, tf.saved_model.Asset(asset))
    functions = {}
    for name, sig in graph.signatures.items():
      functions[name] = _Function(sig, theta)
      setattr(root, name, functions[name])
    tf.saved_model.save(root, path, signatures=functions)
  tf.io.gfile.makedirs(os.path.join(path, os.path.dirname(_DOC_FILE)))
  with tf.io.gfile.GFile(os.path.join(path, _DOC_FILE), 'w') as f:
    f.write(doc)


def Export(params, logdir, export_dir=None, checkpoint=None, batch_size=None,
           max_len=None, key=None):
  """Writes the task's inference graph with a checkpoint's weights.

  Args:
    params: the experiment's model params (overrides applied).
    logdir: the run's logdir; its checkpoints are in `logdir/train`.
    export_dir: the SavedModel's folder; default `logdir/export/<step>`.
    checkpoint: a checkpoint path or step to export; default the latest.
    batch_size: None (a dynamic batch) or the static batch size.
    max_len: None (the task's default) or the static sequence length.

  Returns:
    (the export's folder, the checkpoint's global step).

  Raises:
    ExportError: see the module docstring.
  """
  start = time.perf_counter()
  _CheckOptions(batch_size, max_len)
  task_cls = params.task.cls
  if task_cls.Inference is base_model.BaseTask.Inference:
    raise ExportError(f'{task_cls.__name__} has no export: it implements no '
                      'Inference() (tasks/lm/model.py, tasks/image/model.py '
                      'and tasks/synthetic/keras_regression.py have one).')
  if not logdir:
    raise ExportError('--logdir is required for --mode=export: the run '
                      'whose checkpoint to export.')
  train_dir = os.path.join(logdir, 'train')
  path = _CheckpointPath(train_dir, checkpoint)
  target = export_dir or os.path.join(logdir, 'export',
                                      str(checkpointer.StepOf(path)))
  key = key or params.name
  params = params.Copy()
  params.task.is_inference = True
  logging.info('Exporting %s of %s: building %s with is_inference on one '
               'unnamed device (the loading process places the graph).',
               os.path.basename(path), logdir, task_cls.__name__)
  with _StopOnSignal(), _WholeOrNothing(target) as tmp, _Unplaced():
    try:
      task = params.Instantiate().task
      mismatch = checkpoint_fit.Mismatch(logdir, key, params, task, [path])
      if mismatch:
        raise ExportError(f'{mismatch} Export with the model and overrides '
                          'that trained it; nothing was written.')
      state = eval_programs.CheckpointState(task, train_dir)
      step = state.Restore(path)
      # The weights the evaler uses (EMA ones, if any) into the task's own
      # variables: what the signatures read and a Keras model holds.
      for var, value in zip(task.vars.Flatten(), state.Theta().Flatten()):
        if value is not var:
          var.assign(value)
      graph = task.Inference(batch_size=batch_size, max_len=max_len)
    except checkpointer.UnreadableError as e:
      raise ExportError(f'{e} Export an older one with --checkpoint=<step>.'
                        ) from None
    except ValueError as e:
      raise ExportError(f'--mode=export: {e}') from None
    _Write(graph, task.theta, tmp, _DocText(graph, step, path))
  logging.info('Exported step %d of %s to %s (%.1f s): %s.', step, logdir,
               target, time.perf_counter() - start,
               ', '.join(graph.signatures) or 'the Keras model')
  return target, step
