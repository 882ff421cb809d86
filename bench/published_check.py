"""The planner's predictions beside published measurements of pipelined
Transformer training.

For each row of bench/published_rows.py (a figure a paper measured, with
its model, cluster and layout), the planner gets the same: the LM
(lm.one_billion_wds.OneBWdsGPipeTransformer's task) with the paper's
layers, hidden size, heads, feed-forward size, vocabulary and sequence
length; the cluster's preset or its public specs as --plan_cluster text
(framework/planning/hardware.py's op model: each op of a layer's cost
record timed by its kind and shape); the layout (replicas, pipeline size,
micro-batch size and count, schedule, the paper's cut). Its prediction
(planner.Planner.Predict, from FLOPs and bytes alone: nothing is measured
here) goes beside the figure, as a step time for absolute figures and as
the same normalised throughput for normalised ones.

It prints the table (published, predicted, error: the prediction over
the figure, minus 1, in the figure's unit), the median and worst |error|,
and the ratios a paper's rows imply (one schedule over another, more
micro-batches over fewer, K devices over 2, one layout's throughput per
GPU over another's), each with whether the planner has its sign right
(above or below 1). Target (issue 37): median |error| <= 15%, every sign
right.

Run (about a minute; no TensorFlow ops run, the models are never built):
  .venv/bin/python bench/published_check.py [--markdown]
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import published_rows  # pylint: disable=g-import-not-at-top,wrong-import-position

_BIG = 'lm.one_billion_wds.OneBWdsGPipeTransformer'
# Remat per source: GPipe re-materialises every partition's forward; ZB
# keeps the activations (published_rows.ASSUMED).
_REMAT = {'ZB': 'never', 'GPIPE': 'always', 'DLPERF': 'always'}


def _Params(dims, batch, micro_batches):
  """The LM's params with a paper's dims, batch and micro-batches."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from cadence.framework import model_registry  # pylint: disable=g-import-not-at-top
  params = model_registry.GetParams(_BIG, 'Train')
  layer = params.task.stack_tpl.transformer_tpl
  params.task.Set(vocab_size=dims['vocab'], model_dim=dims['hidden'],
                  fprop_dtype=tf.bfloat16)
  params.task.stack_tpl.Set(num_layers=dims['layers'], splits=1)
  params.task.stack_tpl.pipeline_tpl.Set(num_micro_batches=micro_batches)
  layer.Set(num_heads=dims['heads'], hidden_dim=dims['ffn'])
  params.input.Set(batch_size=batch, max_seq_len=dims['seq'])
  params.input.tokenizer.vocab_size = dims['vocab']
  return params


def _Bounds(layers, stages, source):
  """ZB's cut: the first and last stages one layer fewer than the others
  (published_rows); else None (the planner's even cut)."""
  if source != 'ZB' or (layers + 2) % stages:
    return None
  mid = (layers + 2) // stages
  sizes = [mid - 1] + [mid] * (stages - 2) + [mid - 1]
  bounds = [0]
  for n in sizes:
    bounds.append(bounds[-1] + n)
  return tuple(bounds)


class Predictor:
  """Step times of rows, from the planner (PlanModels cached by shape)."""

  def __init__(self):
    self._models = {}

  def _Model(self, row):
    from cadence.framework.planning import plan_model  # pylint: disable=g-import-not-at-top
    batch = row.replicas * row.micro_batch * row.micro_batches
    key = (row.model, batch, row.micro_batches)
    if key not in self._models:
      self._models[key] = plan_model.PlanModel(_Params(
          published_rows.MODELS[row.model], batch, row.micro_batches))
    return self._models[key]

  def Predict(self, row):
    """The planner's Prediction of `row`'s layout on its cluster."""
    from cadence.framework.planning import hardware  # pylint: disable=g-import-not-at-top
    from cadence.framework.planning import plan_costs  # pylint: disable=g-import-not-at-top
    from cadence.framework.planning import plan_model  # pylint: disable=g-import-not-at-top
    from cadence.framework.planning import planner  # pylint: disable=g-import-not-at-top
    model = self._Model(row)
    hw = hardware.Parse(row.cluster)
    layers = published_rows.MODELS[row.model]['layers']
    layout = plan_model.Layout(
        row.replicas, row.devices, row.devices, row.micro_batches,
        published_rows.SCHEDULES[row.schedule], _REMAT[row.source],
        _Bounds(layers, row.devices, row.source))
    costs = plan_costs.FlopsCosts(model, hw)
    return planner.Planner(model, hw, costs).Predict(layout)


def Compare(predictor, row):
  """(published, predicted) in the row's unit: throughput per GPU, or the
  throughput normalised to its base row."""
  step = predictor.Predict(row).step.time
  base = published_rows.BaseOf(row)
  if row.unit == 'ms/iteration':
    return row.published, 1000 * step
  if base is None:
    samples = row.replicas * row.micro_batch * row.micro_batches
    return row.published, samples / step / (row.replicas * row.devices)
  base_step = predictor.Predict(base).step.time
  # The same batch in both: throughput goes as 1 / step time.
  return row.published, base_step / step


def Ratios(rows, values):
  """(label, published ratio, predicted ratio) of a source's rows that
  differ in one thing: a schedule over 1F1B (same model and M), the most
  micro-batches over the fewest (same model, schedule and table)."""
  by = {r: v for r, v in zip(rows, values)}
  out = []
  for r in rows:
    if r.schedule not in ('1F1B', 'GPipe') and r.source == 'ZB':
      other = r._replace(schedule='1F1B')
      match = [o for o in rows if o == other._replace(
          published=o.published)]
      if match:
        (pub, pred), (pub0, pred0) = by[r], by[match[0]]
        out.append((f'{r.model} M={r.micro_batches}: {r.schedule} / 1F1B',
                    pub / pub0, pred / pred0))
  for r in rows:   # A normalised figure is itself a ratio to its base.
    if published_rows.BaseOf(r) is not None and r.published != 1:
      pub, pred = by[r]
      out.append((f'{r.model} {r.table}: K={r.devices} M={r.micro_batches} '
                  f'/ its base ({r.unit[2:]})', pub, pred))
  timed = [r for r in rows if r.unit == 'ms/iteration']
  per_gpu = {r: [r.replicas * r.micro_batch * r.micro_batches / v /
                 (r.replicas * r.devices) for v in by[r]] for r in timed}
  for a, b in zip(timed, timed[1:]):   # Per GPU, layout over layout.
    out.append((f'{a.model}: R={a.replicas} K={a.devices} / R={b.replicas} '
                f'K={b.devices}, per GPU', per_gpu[a][0] / per_gpu[b][0],
                per_gpu[a][1] / per_gpu[b][1]))
  groups = {}
  for r in rows:
    if r.unit == 'samples/GPU/s':
      groups.setdefault((r.model, r.schedule, r.table), []).append(r)
  for (model, schedule, table), group in groups.items():
    lo = min(group, key=lambda r: r.micro_batches)
    hi = max(group, key=lambda r: r.micro_batches)
    (pub0, pred0), (pub1, pred1) = by[lo], by[hi]
    out.append((f'{model} {schedule} ({table}): M={hi.micro_batches} / '
                f'M={lo.micro_batches}', pub1 / pub0, pred1 / pred0))
  return out


def _ClusterName(text):
  """A row's cluster in a word: its preset, or the device its specs
  describe (published_rows)."""
  first = text.split(',')[0]
  if '=' not in first:
    return first
  for spec, name in (('tflops=61.5', 'TPU v3 cores'), ('tflops=18.7',
                                                        'P100 PCIe'),
                     ('tflops=125', 'V100 SXM2')):
    if spec in text:
      return name
  return 'custom'


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--markdown', action='store_true',
                      help='Print the tables as Markdown (for the README).')
  args = parser.parse_args()
  predictor = Predictor()
  rows = published_rows.ROWS
  values = []
  for i, row in enumerate(rows):
    print(f'[{i + 1}/{len(rows)}] {row.source} {row.table} {row.model} '
          f'{row.schedule} K={row.devices} M={row.micro_batches}...',
          file=sys.stderr, flush=True)
    values.append(Compare(predictor, row))
  errors = [pred / pub - 1 for pub, pred in values]
  md = args.markdown
  head = ('| source | model | cluster | R | K | micro-batch x M | schedule '
          '| published | predicted | error |\n|---|---|---|---|---|---|---|---|'
          '---|---|' if md else
          f'{"source":<15}{"model":<11}{"K":>3}{"mb x M":>10}  '
          f'{"schedule":<7}{"unit":<15}{"published":>10}{"predicted":>10}'
          f'{"error":>8}')
  print(head)
  for row, (pub, pred), err in zip(rows, values, errors):
    cluster = _ClusterName(row.cluster)
    if md:
      print(f'| {row.source} {row.table} | {row.model} | {cluster} | '
            f'{row.replicas} | {row.devices} | {row.micro_batch} x '
            f'{row.micro_batches} | {row.schedule} | {pub:g} {row.unit} | '
            f'{float(f"{pred:.3g}"):g} | {100 * err:+.0f}% |')
    else:
      print(f'{row.source + " " + row.table:<15}{row.model:<11}'
            f'{row.devices:>3}{f"{row.micro_batch}x{row.micro_batches}":>10}'
            f'  {row.schedule:<7}{row.unit:<15}{pub:>10.3g}{pred:>10.3g}'
            f'{100 * err:>+7.1f}%')
  abs_err = sorted(abs(e) for e in errors)
  print(f'\n{len(rows)} rows from {len({r.source for r in rows})} sources: '
        f'|error| median {100 * statistics.median(abs_err):.1f}% (target '
        f'<= 15%), worst {100 * abs_err[-1]:.1f}%')
  for source in sorted({r.source for r in rows}):
    mine = [abs(e) for r, e in zip(rows, errors) if r.source == source]
    print(f'  {source}: median {100 * statistics.median(mine):.1f}% over '
          f'{len(mine)} rows')
  ratios = Ratios(rows, values)
  right = [(p > 1) == (q > 1) for _, p, q in ratios]
  print(f'\nRatios within a source (published, predicted; sign: both above '
        f'or both below 1): {sum(right)} of {len(ratios)} right')
  if md:
    print('\n| ratio | published | predicted | sign |\n|---|---|---|---|')
  for (label, pub, pred), ok in zip(ratios, right):
    if md:
      print(f'| {label} | {pub:.3f} | {pred:.3f} | '
            f'{"right" if ok else "WRONG"} |')
    else:
      print(f'  {label:<44}{pub:>7.3f}{pred:>8.3f}  '
            f'{"right" if ok else "WRONG"}')
  print(f'\nAssumed: {published_rows.ASSUMED}')


if __name__ == '__main__':
  sys.exit(main())
