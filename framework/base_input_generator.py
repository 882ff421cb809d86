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
A pattern matching no file, or only empty files, is an `InputError`
naming it.

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


class InputError(ValueError):
  """Bad input configuration: no files, empty files, bad batching params."""


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
    p.Define('num_input_shards', 1, 'Split the files among this many input '
             'workers, an int > 0.')
    p.Define('input_shard_index', 0, 'Which share of the files this worker '
             'reads, in [0, num_input_shards).')
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
    files, missing = ExpandFilePattern(p.file_pattern)
    if missing:
      raise InputError(
          f'{type(self).__name__} {p.name!r}: file_pattern '
          f'{p.file_pattern!r} matches no files for: {", ".join(missing)}.')
    if all(tf.io.gfile.stat(f).length == 0 for f in files):
      raise InputError(
          f'{type(self).__name__} {p.name!r}: file_pattern '
          f'{p.file_pattern!r} matches {len(files)} file(s), all empty.')
    files = self._ShardFiles(files)
    if not files:
      raise InputError(
          f'{type(self).__name__} {p.name!r}: input shard '
          f'{p.input_shard_index} of {p.num_input_shards} gets none of the '
          f'files of {p.file_pattern!r}; use fewer input shards.')
    return files

  def _ShardFiles(self, files):
    """This input shard's share of the sorted files: every
    `num_input_shards`-th from `input_shard_index`. A subclass that shards
    its batches instead (LmInput) returns all of them."""
    p = self._params
    return files[p.input_shard_index::p.num_input_shards]

  # --- properties --------------------------------------------------------

  @property
  def params(self):
    return self._params

  @property
  def files(self):
    """The data files this generator reads, sorted (this shard's share)."""
    return list(self._files)

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
      num_replicas: replicas the batches are split among; batches hold
        `num_replicas * batch_size` examples.

    Returns:
      A tf.data.Dataset of NestedMaps of batched tensors ([batch, ...]).
    """
    p = self._params
    records = self._RecordDataset()
    if p.shuffle:
      records = records.shuffle(p.shuffle_buffer_size, seed=p.random_seed,
                                reshuffle_each_iteration=True)
    if self._Vectorised():
      batches = records.batch(p.batch_size * num_replicas,
                              drop_remainder=bool(p.fixed_input_shape))
      batches = batches.map(
          lambda r: NestedMap(self._ProcessRecordBatch(r)),
          num_parallel_calls=p.num_parallel_calls, deterministic=True)
    else:
      examples = records.map(
          lambda r: NestedMap(self._ProcessRecord(r)),
          num_parallel_calls=p.num_parallel_calls, deterministic=True)
      if type(self)._KeepExample is not BaseInputGenerator._KeepExample:
        examples = examples.filter(self._KeepExample)
      batches = self._Batch(examples, num_replicas)
    if start_batch:
      batches = batches.skip(int(start_batch))
    return batches.prefetch(tf.data.AUTOTUNE)

  def __repr__(self):
    files = ', '.join(os.path.basename(f) for f in self._files[:3])
    more = '...' if len(self._files) > 3 else ''
    return (f'{type(self).__name__}({self._params.name!r}, '
            f'files=[{files}{more}])')
