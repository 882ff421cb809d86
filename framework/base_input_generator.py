"""The tf.data input generator base: files, order, batching, resuming.

An input generator turns `Params` into a `tf.data.Dataset` of batches, each a
NestedMap of tensors. The pipeline is

  files (sorted; shuffled per epoch with the seed; repeated)
    -> records (`_RecordDataset`)            e.g. text lines
    -> shuffle buffer (seeded)
    -> examples (`_ProcessRecord`)           NestedMap of tensors
    -> batches, or buckets by length (`_ExampleLength`)
    -> skip(start_batch)                     resume

and is a deterministic function of the params (the seed included): batch i
is the same batch in every process. The trainer keeps the number of batches
consumed (the *input position*, equal to the global step when training) in
its checkpoints and rebuilds the pipeline with `Dataset(start_batch=pos)`,
so a restarted run reads exactly the batches an uninterrupted run would
have. Skipping re-reads the records it skips; that costs time proportional
to the position, never correctness.

File patterns: a comma-separated list of globs (`/data/train-*`) or sharded
names (`/data/train@8` = `/data/train-00000-of-00008` ... `-00007-of-00008`).
A pattern matching no file, a directory, only empty files, or (for text) a
file that is not text (`FileProblem`) is an `InputError` naming it.

Hosts: batch i of the job is one *global batch* whatever the layout. With
`num_input_shards` S hosts (the trainer sets S and `input_shard_index` h),
each host builds the global batches of S x num_replicas replicas and keeps
its share, rows `HostRows(n)` of a batch of n rows (the h-th of S equal
shares), which its replicas split in turn. So S hosts x R replicas train
on exactly the rows one host with S*R replicas would, and every subclass
gets this by building its batches in `Dataset` (or by selecting rows with
`HostRows`, as tasks/lm/input_generator.py does). Every host reads every
file; when rows are processed one by one (`_ProcessRecordBatch`) a host
processes only its share, otherwise it builds the whole global batch (so
that bucketing, filtering and padding see the same examples) and slices it.

Example (a subclass reading 'x,y' text lines):
  class PairInput(BaseInputGenerator):
    def _ProcessRecord(self, record):
      x, y = tf.unstack(tf.strings.to_number(
          tf.strings.split(record, ','), tf.float32))
      return NestedMap(x=x, y=y)

  p = PairInput.Params().Set(file_pattern='/tmp/pairs-*.csv', batch_size=4)
  batches = p.Instantiate().Dataset()   # x: [4], y: [4]
"""
import os
import re

import tensorflow as tf

from cadence.framework import hyperparams
from cadence.framework.nested_map import NestedMap
from cadence.framework import validation

_SHARDED_RE = re.compile(r'^(.*)@(\d+)$')


_TEXT_HEAD_BYTES = 1 << 16


class InputError(ValueError):
  """Bad input configuration: no files, empty files, bad batching params."""


def FileProblem(path, file_type='text'):
  """Why `path` cannot be a data file of `file_type`, or None if it can.

  A directory never can. A text file must be UTF-8 text: its first 64 KiB
  hold no NUL byte and at most a quarter of undecodable bytes (a corpus
  with a few bad lines passes; binary, compressed or UTF-16 files do not).

  Returns:
    None, or the rule `path` breaks, a phrase to follow its name
    ('is a directory, ...').
  """
  if tf.io.gfile.isdir(path):
    return (f'is a directory, not a file; name the files in it (e.g. '
            f'{os.path.join(path, "*")!r})')
  if file_type != 'text':
    return None
  with tf.io.gfile.GFile(path, 'rb') as f:
    head = f.read(_TEXT_HEAD_BYTES)
  if b'\0' in head:
    return (f'is not text: it holds NUL bytes (byte {head.index(0)}); a '
            'binary, compressed or UTF-16 file?')
  bad = (head.decode('utf-8', errors='replace').count('\ufffd') -
         head.count('\ufffd'.encode('utf-8')))
  if 4 * bad > len(head):
    return (f'is not text: {bad} of its first {len(head)} bytes are not '
            'UTF-8; a binary or compressed file?')
  return None


def ExpandFilePattern(pattern):
  """Files of a comma-separated list of globs and `name@N` sharded specs.

  Args:
    pattern: e.g. '/data/a-*.txt,/data/b@4'.

  Returns:
    (sorted list of file paths, list of the sub-patterns matching nothing).
  """
  files, missing = set(), []
  for part in [s.strip() for s in pattern.split(',') if s.strip()]:
    m = _SHARDED_RE.match(part)
    if m:
      n = int(m.group(2))
      names = [f'{m.group(1)}-{i:05d}-of-{n:05d}' for i in range(n)]
      found = [f for f in names if tf.io.gfile.exists(f)]
      if len(found) < n:
        missing.append(f'{part} ({n - len(found)} of {n} shards missing)')
    else:
      found = tf.io.gfile.glob(part)
      if not found:
        missing.append(part)
    files.update(found)
  return sorted(files), missing


def CheckedFiles(pattern, owner, file_type='text', field='file_pattern'):
  """The files of `pattern`, checked: some match, none is a directory or
  (for text) not text (`FileProblem`), not all are empty.

  Args:
    pattern: a file pattern (see the module docstring).
    owner: who reads them, for messages ("LmInput 'lm_train'").
    file_type: 'text' or 'tfrecord'.
    field: the params field that holds `pattern`, for messages.

  Returns:
    The sorted list of files.

  Raises:
    InputError: naming `owner`, the pattern, the file and the rule.
  """
  files, missing = ExpandFilePattern(pattern)
  if missing:
    raise InputError(f'{owner}: {field} {pattern!r} matches no files for: '
                     f'{", ".join(missing)}.')
  for path in files:
    problem = FileProblem(path, file_type)
    if problem:
      raise InputError(f'{owner}: {path!r} (of {field} {pattern!r}) '
                       f'{problem}.')
  if all(tf.io.gfile.stat(f).length == 0 for f in files):
    raise InputError(f'{owner}: {field} {pattern!r} matches {len(files)} '
                     'file(s), all empty.')
  return files


def RealExamples(batch):
  """[b] bool: which examples of a batch are real, not padding.

  An example is padding when every value of its '*paddings' fields is 1
  (`BaseInputGenerator._PaddingValue`'s fill), as the rows that fill up the
  last batch of a pass (LmInput with fixed_input_shape); in a batch without
  such fields every example is real.

  Args:
    batch: a NestedMap of [b, ...] tensors.
  """
  batch = NestedMap(batch)
  real = tf.ones([tf.shape(batch.Flatten()[0])[0]], tf.bool)
  for key, x in batch.FlattenItems():
    if key.split('.')[-1].endswith('paddings'):
      x = tf.reshape(x, [tf.shape(x)[0], -1])
      real = tf.logical_and(real, tf.reduce_any(x < 1, axis=1))
  return real


class BaseInputGenerator:
  """Builds batches from records; subclasses define records and examples.

  Subclasses implement `_ProcessRecord(record) -> NestedMap` and, to bucket
  by length, `_ExampleLength(example)`. A generator with no files (e.g.
  synthetic data) overrides `_RecordDataset()` and `_NeedsFiles()`.

  `batch_size` is per replica: `Dataset(num_replicas=R)` yields global
  batches of R * batch_size examples, which a tf.distribute strategy splits.
  """

  @classmethod
  def Params(cls):
    p = hyperparams.InstantiableParams(cls)
    p.Define('name', 'input', 'Name of the generator, used in messages.')
    p.Define('batch_size', 8, 'Examples per batch per replica, an int > 0 '
             '(without bucketing).')
    p.Define('file_pattern', '', 'Comma-separated globs or `name@N` sharded '
             'file names of the data.')
    p.Define('file_type', 'text', "Record format of the files: 'text' (one "
             "record per line) or 'tfrecord'.")
    p.Define('random_seed', 1234, 'Seed of the file and record shuffling, '
             'an int; same seed, same order of batches.')
    p.Define('shuffle', True, 'Whether to shuffle files and records.')
    p.Define('shuffle_buffer_size', 1024, 'Records in the shuffle buffer.')
    p.Define('repeat', True, 'Cycle over the data forever (train) or read '
             'it once (eval).')
    p.Define('num_input_shards', 1, 'Hosts that read this input together, '
             'an int > 0: each reads its share of every global batch (set '
             'by the trainer; see the module docstring).')
    p.Define('input_shard_index', 0, 'Which share of the global batches '
             'this host reads, in [0, num_input_shards).')
    p.Define('bucket_upper_bound', [], 'Bucketing by length: inclusive '
             'upper bounds of the buckets, increasing ints; longer examples '
             'are dropped. Empty: no bucketing.')
    p.Define('bucket_batch_limit', [], 'Batch size per bucket per replica, '
             'one per bucket_upper_bound; empty: batch_size for all.')
    p.Define('fixed_input_shape', False, 'Static batch and length: drop '
             'the last partial batch and pad to the bucket bound (pipelines '
             'and TPUs need static shapes). The batch dim is static in the '
             'element spec when all buckets have the same batch limit, the '
             'length too with a single bucket.')
    p.Define('num_parallel_calls', 2, 'Parallel calls of _ProcessRecord; '
             'order stays deterministic.')
    return p

  def __init__(self, params):
    self._params = params.Copy().Freeze()
    type(self).CheckParams(self._params)
    self._files = self._ResolveFiles()

  # --- validation --------------------------------------------------------

  def _Error(self, field, value, rule):
    """An InputError naming this generator, the field, the value, the rule."""
    return validation.Error(validation.Owner(self), field, value, rule,
                            error_cls=InputError)

  @classmethod
  def CheckParams(cls, params):
    """Checks the values of `params` from params alone (no file is read).

    Each error names the generator, its params path (the key to override,
    e.g. 'input'), the field, the value and the rule:

      LmInput 'lm_train' (params 'input'): batch_size=32.5 must be an int
      >= 1.

    The generator checks its params when built, and a task before it
    derives shapes from them (`BaseTask.CheckStaticShapes`). Subclasses
    extend `_CheckParams`.

    Raises:
      InputError: a bad value.
    """
    try:
      cls._CheckParams(params, validation.Owner(params))
    except InputError:
      raise
    except (ValueError, TypeError) as e:
      raise InputError(str(e)) from None

  @classmethod
  def _CheckParams(cls, p, owner):
    """Raises ValueError (validation's checks) for a bad value of `p`;
    subclasses add their params' checks after calling super."""
    validation.CheckInt(owner, 'batch_size', p.batch_size)
    validation.CheckOneOf(owner, 'file_type', p.file_type, ('text', 'tfrecord'))
    validation.CheckInt(owner, 'random_seed', p.random_seed, 0)
    for field in ('shuffle', 'repeat', 'fixed_input_shape'):
      validation.CheckBool(owner, field, p.Get(field))
    validation.CheckInt(owner, 'shuffle_buffer_size', p.shuffle_buffer_size)
    validation.CheckInt(owner, 'num_input_shards', p.num_input_shards)
    validation.CheckInt(owner, 'input_shard_index', p.input_shard_index, 0,
                        p.num_input_shards - 1)
    if p.num_parallel_calls != tf.data.AUTOTUNE:
      validation.CheckInt(owner, 'num_parallel_calls', p.num_parallel_calls)
    bounds = validation.CheckIntList(owner, 'bucket_upper_bound',
                                     list(p.bucket_upper_bound))
    if bounds != sorted(set(bounds)):
      raise validation.Error(owner, 'bucket_upper_bound', bounds,
                             'must be strictly increasing ints >= 1.')
    limits = validation.CheckIntList(owner, 'bucket_batch_limit',
                                     list(p.bucket_batch_limit))
    if limits and len(limits) != len(bounds):
      raise validation.Error(owner, 'bucket_batch_limit', limits,
                             f'needs one entry per bucket ({len(bounds)}).')

  def _NeedsFiles(self):
    """True if the records come from `file_pattern` (the default)."""
    return True

  def _ResolveFiles(self):
    p = self._params
    if not p.file_pattern:
      if self._NeedsFiles():
        raise self._Error('file_pattern', p.file_pattern,
                          'is empty; set it to the data files.')
      return []
    return CheckedFiles(p.file_pattern, f'{type(self).__name__} {p.name!r}',
                        p.file_type)

  # --- properties --------------------------------------------------------

  @property
  def params(self):
    return self._params

  @property
  def files(self):
    """The data files this generator reads, sorted (every host reads all)."""
    return list(self._files)

  def HostRows(self, n):
    """[begin, end): this host's rows of a global batch of `n` rows.

    The `input_shard_index`-th of `num_input_shards` consecutive shares of
    ceil(n / num_input_shards) rows (the last ones shorter, possibly empty,
    when n is not a multiple); `n` may be an int or an int tensor.
    """
    p = self._params
    share = -(-n // p.num_input_shards)
    return p.input_shard_index * share, (p.input_shard_index + 1) * share

  def _HostShare(self, batch):
    """This host's rows of a global batch (a NestedMap); all of them on one
    host. A static batch dim stays static."""
    if self._params.num_input_shards == 1:
      return batch
    batch = NestedMap(batch)
    first = batch.Flatten()[0]
    n = first.shape[0] if first.shape[0] is not None else tf.shape(first)[0]
    begin, end = self.HostRows(n)
    if isinstance(n, int):
      begin, end = min(begin, n), min(end, n)
    return batch.Transform(lambda x: x[begin:end])

  @classmethod
  def BatchShapes(cls, params):
    """NestedMap of `shapes.Shape`: one replica's batch, from params alone.

    No data is read; a dim known only from the data is None. Tasks check
    their params against these shapes when they are built
    (`BaseTask.CheckStaticShapes`) and `--mode=inspect_model` costs a model
    with them. A subclass lists (at least) the fields its tasks' FPropMeta
    reads; the base class cannot know them.

    Raises:
      NotImplementedError: the generator does not say.
    """
    raise NotImplementedError(
        f'{cls.__name__} does not define BatchShapes(params).')

  def GlobalBatchSize(self, num_replicas=1):
    """Examples per batch across replicas (the largest bucket's limit)."""
    p = self._params
    per_replica = max(p.bucket_batch_limit) if p.bucket_batch_limit else (
        p.batch_size)
    return per_replica * num_replicas

  # --- subclass hooks ----------------------------------------------------

  def _RecordDataset(self):
    """Dataset of raw records, files in a seeded order, repeated if asked."""
    p = self._params
    files = tf.data.Dataset.from_tensor_slices(self._files)
    if p.shuffle and len(self._files) > 1:
      files = files.shuffle(len(self._files), seed=p.random_seed,
                            reshuffle_each_iteration=True)
    if p.repeat:
      files = files.repeat()
    reader = (tf.data.TextLineDataset if p.file_type == 'text' else
              tf.data.TFRecordDataset)
    return files.flat_map(reader)

  def _ProcessRecord(self, record):
    """One record -> one example, a NestedMap of tensors."""
    raise NotImplementedError(
        f'{type(self).__name__} must implement _ProcessRecord(record).')

  def _ProcessRecordBatch(self, records):
    """Optional vectorised `_ProcessRecord`: [n] records -> a batch.

    tf.data spends tens of microseconds per element on a map, which
    throttles small models; a subclass that can process a whole batch of
    records at once overrides this, and the pipeline batches records first
    and maps once per batch (used when not bucketing and `_KeepExample`
    is not overridden).
    """
    raise NotImplementedError

  def _Vectorised(self):
    cls = type(self)
    return (cls._ProcessRecordBatch is not
            BaseInputGenerator._ProcessRecordBatch and
            cls._KeepExample is BaseInputGenerator._KeepExample and
            not self._params.bucket_upper_bound)

  def _KeepExample(self, example):
    """Bool scalar: whether to keep `example` (default: all)."""
    del example
    return tf.constant(True)

  def _ExampleLength(self, example):
    """Int32 scalar length of an example, for bucketing."""
    raise NotImplementedError(
        f'{type(self).__name__} sets bucket_upper_bound but implements no '
        '_ExampleLength(example).')

  def _PaddingValue(self, key, spec):
    """The value padding fills field `key` with: 1 for '*paddings', else 0."""
    one = key.split('.')[-1].endswith('paddings')
    return tf.constant(1 if one else 0, spec.dtype) if spec.dtype != (
        tf.string) else tf.constant('', tf.string)

  # --- the pipeline ------------------------------------------------------

  def _Padding(self, spec):
    keys = [k for k, _ in spec.FlattenItems()]
    return spec.Pack([self._PaddingValue(k, s)
                      for k, s in zip(keys, spec.Flatten())])

  def _Batch(self, examples, num_replicas):
    p = self._params
    drop = bool(p.fixed_input_shape)
    spec = NestedMap(examples.element_spec)
    if not p.bucket_upper_bound:
      size = p.batch_size * num_replicas
      if all(s.shape.is_fully_defined() for s in spec.Flatten()):
        return examples.batch(size, drop_remainder=drop)
      if p.fixed_input_shape:
        raise self._Error('fixed_input_shape', True, 'needs '
                          'bucket_upper_bound for variable-length examples.')
      return examples.padded_batch(size, padding_values=self._Padding(spec),
                                   drop_remainder=drop)
    bounds = list(p.bucket_upper_bound)
    limits = list(p.bucket_batch_limit) or [p.batch_size] * len(bounds)
    examples = examples.filter(
        lambda ex: self._ExampleLength(ex) <= bounds[-1])
    batches = examples.bucket_by_sequence_length(
        element_length_func=self._ExampleLength,
        bucket_boundaries=[b + 1 for b in bounds],
        bucket_batch_sizes=[n * num_replicas for n in limits] + [1],
        padding_values=self._Padding(spec),
        pad_to_bucket_boundary=drop,
        drop_remainder=drop)
    if drop and len(set(limits)) == 1:
      # Make the static part of the shapes known to tf.function: the batch
      # dim (equal limits) and, with one bucket, the padded length.
      batch = limits[0] * num_replicas
      length = bounds[0] if len(bounds) == 1 else None

      def _Static(x):
        dims = x.shape.as_list()
        if not dims:
          return x
        dims[0] = batch
        if length is not None:
          dims = [length if d is None else d for d in dims]
        return tf.ensure_shape(x, dims)

      batches = batches.map(lambda b: NestedMap(b).Transform(_Static))
    return batches

  def Dataset(self, start_batch=0, num_replicas=1):
    """The dataset of batches, starting at batch `start_batch`.

    Args:
      start_batch: batches to skip (the input position to resume from).
      num_replicas: this host's replicas, which split its batches; batches
        hold `num_replicas * batch_size` examples, this host's share of a
        global batch of `num_input_shards` times as many.

    Returns:
      A tf.data.Dataset of NestedMaps of batched tensors ([batch, ...]).
    """
    p = self._params
    records = self._RecordDataset()
    if p.shuffle:
      records = records.shuffle(p.shuffle_buffer_size, seed=p.random_seed,
                                reshuffle_each_iteration=True)
    # The global batches of all hosts' replicas; this host keeps its share.
    global_replicas = num_replicas * p.num_input_shards
    if self._Vectorised():  # Rows are independent: share the records.
      batches = records.batch(p.batch_size * global_replicas,
                              drop_remainder=bool(p.fixed_input_shape))
      batches = batches.map(
          lambda r: NestedMap(self._ProcessRecordBatch(
              self._HostShare(NestedMap(r=r)).r)),
          num_parallel_calls=p.num_parallel_calls, deterministic=True)
    else:
      examples = records.map(
          lambda r: NestedMap(self._ProcessRecord(r)),
          num_parallel_calls=p.num_parallel_calls, deterministic=True)
      if type(self)._KeepExample is not BaseInputGenerator._KeepExample:
        examples = examples.filter(self._KeepExample)
      batches = self._Batch(examples, global_replicas)
      if p.num_input_shards > 1:
        batches = batches.map(self._HostShare)
    if start_batch:
      batches = batches.skip(int(start_batch))
    return batches.prefetch(tf.data.AUTOTUNE)

  def __repr__(self):
    files = ', '.join(os.path.basename(f) for f in self._files[:3])
    more = '...' if len(self._files) > 3 else ''
    return (f'{type(self).__name__}({self._params.name!r}, '
            f'files=[{files}{more}])')
