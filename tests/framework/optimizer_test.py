"""Tests for cadence.framework.optimizer: each rule against numpy."""
import os

import numpy as np
import tensorflow as tf

from cadence.framework import optimizer

_LRS = [0.1, 0.05, 0.2]  # A different learning rate at each step.


def _Grads(rng, shapes, steps=3):
  return [[rng.randn(*s).astype(np.float32) for s in shapes]
          for _ in range(steps)]


def _NpSGD(x, grads, lrs):
  for g, lr in zip(grads, lrs):
    x = x - lr * g
  return x


def _NpMomentum(x, grads, lrs, alpha, nesterov):
  m = np.zeros_like(x)
  for g, lr in zip(grads, lrs):
    m = alpha * m + g
    x = x - lr * (g + alpha * m if nesterov else m)
  return x


def _NpAdam(x, grads, lrs, b1, b2, eps):
  m, v = np.zeros_like(x), np.zeros_like(x)
  for t, (g, lr) in enumerate(zip(grads, lrs), start=1):
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    x = x - lr * np.sqrt(1 - b2**t) / (1 - b1**t) * m / (np.sqrt(v) + eps)
  return x


def _NpAdafactor(x, grads, lrs, factored, beta1, clip, eps1=1e-30,
                 eps2=1e-3, decay_exponent=0.8):
  x = x.astype(np.float64)
  vr = np.zeros(x.shape[:-1])
  vc = np.zeros(x.shape[:-2] + x.shape[-1:])
  v = np.zeros_like(x)
  m = np.zeros_like(x)
  for t, (g, lr) in enumerate(zip(grads, lrs), start=1):
    g = g.astype(np.float64)
    d = 1 - t**-decay_exponent
    g2 = g * g + eps1
    if factored:
      vr = d * vr + (1 - d) * g2.mean(-1)
      vc = d * vc + (1 - d) * g2.mean(-2)
      v_hat = vr[..., :, None] * vc[..., None, :] / vr.mean(-1)[..., None,
                                                              None]
    else:
      v = d * v + (1 - d) * g2
      v_hat = v
    u = g / np.sqrt(v_hat)
    if clip:
      u /= max(1.0, np.sqrt(np.mean(u * u)) / clip)
    if beta1:
      m = beta1 * m + (1 - beta1) * u
      u = m
    x = x - lr * max(eps2, np.sqrt(np.mean(x * x))) * u
  return x


def _AncestorOps(op):
  """The ops `op` depends on, through data and control inputs."""
  seen, todo = {}, [op]
  while todo:
    node = todo.pop()
    for parent in [t.op for t in node.inputs] + list(node.control_inputs):
      if parent.name not in seen:
        seen[parent.name] = parent
        todo.append(parent)
  return list(seen.values())


def _Ancestors(op):
  """Names of the ops `op` depends on, through data and control inputs."""
  return {a.name for a in _AncestorOps(op)}


def _TouchesState(op):
  """Whether `op` reads a variable's value or updates one in place (the
  scalar count of updates aside)."""
  return (op.type.startswith('ResourceApply') or
          op.type == 'ReadVariableOp' and bool(op.outputs[0].shape.rank))


def _StateOps(graph):
  """[(op, names of the ops of `graph` it depends on)] for each op touching
  a variable's state, in `graph` or in a branch of one of its conds (where
  a branch's inputs stand for the cond's)."""
  found = []
  for op in graph.get_operations():
    if _TouchesState(op):
      found.append((op, _Ancestors(op)))
    if op.type not in ('If', 'StatelessIf'):
      continue
    for attr in ('then_branch', 'else_branch'):
      branch = graph._get_function(op.get_attr(attr).name).graph  # pylint: disable=protected-access
      for inner in filter(_TouchesState, branch.get_operations()):
        outer = set()
        for a in _AncestorOps(inner):
          if a.type == 'Placeholder':
            source = op.inputs[1 + [t.op for t in branch.inputs].index(a)]
            outer |= _Ancestors(source.op) | {source.op.name}
        found.append((inner, outer))
  return found


class OptimizerTest(tf.test.TestCase):

  def _Run(self, p, inits, grads, lrs=_LRS, traced=True):
    """Applies `grads` (per step, per var) with `lrs`; returns var values."""
    variables = [tf.Variable(x) for x in inits]
    opt = p.Instantiate()
    opt.Build([(f'v{i}', v) for i, v in enumerate(variables)])

    def Step(lr, gs):
      opt.Apply(lr, zip(gs, variables))

    fn = tf.function(Step) if traced else Step
    for gs, lr in zip(grads, lrs):
      fn(tf.constant(lr), [tf.constant(g) for g in gs])
    if traced:  # The changing learning rate did not retrace.
      self.assertEqual(fn.experimental_get_tracing_count(), 1)
    self.assertEqual(int(opt.num_updates.numpy()), len(grads))
    return [v.numpy() for v in variables]

  def testSGDExact(self):
    rng = np.random.RandomState(0)
    inits = [rng.randn(3, 2).astype(np.float32)]
    grads = _Grads(rng, [(3, 2)])
    got = self._Run(optimizer.SGD.Params(), inits, grads)
    want = _NpSGD(inits[0], [g[0] for g in grads], np.float32(_LRS))
    self.assertAllClose(got[0], want, atol=1e-7, rtol=0)

  def testSGDEagerEqualsTraced(self):
    rng = np.random.RandomState(1)
    inits = [rng.randn(4).astype(np.float32)]
    grads = _Grads(rng, [(4,)])
    eager = self._Run(optimizer.SGD.Params(), inits, grads, traced=False)
    traced = self._Run(optimizer.SGD.Params(), inits, grads)
    self.assertAllClose(eager[0], traced[0], atol=1e-7)

  def testMomentum(self):
    for nesterov in (False, True):
      rng = np.random.RandomState(2)
      inits = [rng.randn(3, 2).astype(np.float32),
               rng.randn(5).astype(np.float32)]
      grads = _Grads(rng, [(3, 2), (5,)])
      p = optimizer.Momentum.Params().Set(alpha=0.9, use_nesterov=nesterov)
      got = self._Run(p, inits, grads)
      for i in range(2):
        want = _NpMomentum(inits[i], [g[i] for g in grads], _LRS, 0.9,
                           nesterov)
        self.assertAllClose(got[i], want, atol=1e-6, rtol=1e-6)

  def testAdam(self):
    rng = np.random.RandomState(3)
    inits = [rng.randn(3, 4).astype(np.float32)]
    grads = _Grads(rng, [(3, 4)])
    p = optimizer.Adam.Params().Set(beta1=0.8, beta2=0.99, epsilon=1e-7)
    got = self._Run(p, inits, grads)
    want = _NpAdam(inits[0].astype(np.float64),
                   [g[0].astype(np.float64) for g in grads], _LRS, 0.8, 0.99,
                   1e-7)
    self.assertAllClose(got[0], want, atol=1e-5, rtol=1e-5)

  def testUpdateReadsItsStateOnlyOnceTheGradientExists(self):
    # Read earlier, a variable and its slots (and what Adam computes of
    # them alone) would be held while the forward and backward run: two
    # more copies of the model in a training step. A fused kernel (Adam,
    # Momentum) reads them itself: one op; a pure rule reads each.
    for p, fused in ((optimizer.Adam.Params(), True),
                     (optimizer.Momentum.Params(), True),
                     (optimizer.Adafactor.Params().Set(beta1=0.9), False)):
      var = tf.Variable(tf.ones([4, 6]))
      opt = p.Instantiate()
      opt.Build([('w', var)])
      touching = 1 if fused else 1 + len(opt.Slots(var))

      def Step(x, opt=opt, var=var):
        grad = tf.identity(tf.matmul(x, x, transpose_a=True), name='grad')
        opt.Apply(0.1, [(grad[:4], var)])

      graph = tf.function(Step).get_concrete_function(
          tf.TensorSpec([6, 6])).graph
      found = _StateOps(graph)
      with self.subTest(optimizer=p.cls.__name__):
        self.assertLen(found, touching)
        for op, ancestors in found:
          self.assertIn('grad', ancestors, op.name)

  def testAdafactorMatchesNumpy(self):
    rng = np.random.RandomState(4)
    shapes = [(4, 6), (2, 4, 6), (5,), (4, 6)]
    inits = [rng.randn(*s).astype(np.float32) for s in shapes]
    grads = _Grads(rng, shapes)
    # Factored for the first two (last dims >= 4); the 1-D and the last
    # (scaled-down gradient so that clipping does not bind) in full.
    for step in grads:
      step[3] *= 1e-3
    for beta1, clip in ((0.0, 1.0), (0.9, 0.0)):
      p = optimizer.Adafactor.Params().Set(
          min_dim_size_to_factor=4, beta1=beta1, clipping_threshold=clip)
      opt_vars = self._Run(p, inits[:3], [g[:3] for g in grads])
      for i in range(3):
        want = _NpAdafactor(inits[i], [g[i] for g in grads], _LRS,
                            factored=len(shapes[i]) >= 2, beta1=beta1,
                            clip=clip)
        self.assertAllClose(opt_vars[i], want, atol=1e-5, rtol=1e-5)
    p = optimizer.Adafactor.Params().Set(factored=False)
    got = self._Run(p, inits[3:], [g[3:] for g in grads])
    want = _NpAdafactor(inits[3], [g[3] for g in grads], _LRS,
                        factored=False, beta1=0.0, clip=1.0)
    self.assertAllClose(got[0], want, atol=1e-5, rtol=1e-5)

  def testAdafactorSlotShapes(self):
    opt = optimizer.Adafactor.Params().Set(
        min_dim_size_to_factor=4, beta1=0.5).Instantiate()
    big, small = tf.Variable(tf.zeros([3, 4, 5])), tf.Variable(tf.zeros([3, 2]))
    opt.Build([('big', big), ('small', small)])
    shapes = {k: v.shape.as_list() for k, v in opt.Slots(big).items()}
    self.assertEqual(shapes, {'vr': [3, 4], 'vc': [3, 5], 'm': [3, 4, 5]})
    shapes = {k: v.shape.as_list() for k, v in opt.Slots(small).items()}
    self.assertEqual(shapes, {'v': [3, 2], 'm': [3, 2]})

  def testAdafactorReducesQuadratic(self):
    rng = np.random.RandomState(5)
    target = tf.constant(rng.randn(8, 8).astype(np.float32))
    w = tf.Variable(tf.zeros([8, 8]) + 0.5)
    w0 = w.numpy()
    opt = optimizer.Adafactor.Params().Set(
        min_dim_size_to_factor=8).Instantiate()
    opt.Build([('w', w)])

    @tf.function
    def Step():
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(w - target))
      opt.Apply(0.1, [(tape.gradient(loss, w), w)])
      return loss

    losses = [float(Step()) for _ in range(30)]
    self.assertLess(losses[-1], 0.5 * losses[0])
    self.assertGreater(np.abs(w.numpy() - w0).max(), 0.1)

  def testSkipLeavesEverythingBitIdentical(self):
    for p in (optimizer.Momentum.Params(), optimizer.Adam.Params(),
              optimizer.Adafactor.Params().Set(min_dim_size_to_factor=2,
                                               beta1=0.9)):
      v = tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3))
      opt = p.Instantiate()
      opt.Build([('v', v)])

      @tf.function
      def Step(g, skip, opt=opt, v=v):
        opt.Apply(0.1, [(g, v)], skip=skip)

      Step(tf.ones([2, 3]), tf.constant(False))
      before = [v.numpy()] + [s.numpy() for s in opt.Slots(v).values()]
      Step(tf.fill([2, 3], np.nan), tf.constant(True))
      after = [v.numpy()] + [s.numpy() for s in opt.Slots(v).values()]
      for b, a in zip(before, after):
        self.assertEqual(b.tobytes(), a.tobytes())
      self.assertEqual(int(opt.num_updates.numpy()), 1)

  def testCheckpointRoundTrip(self):
    v = tf.Variable([1.0, 2.0])
    opt = optimizer.Adam.Params().Instantiate()
    opt.Build([('layer.w[0]', v)])
    opt.Apply(0.1, [(tf.constant([1.0, -1.0]), v)])
    saved = {k: s.numpy() for k, s in opt.Slots(v).items()}
    path = tf.train.Checkpoint(opt=opt.checkpointables).save(
        os.path.join(self.get_temp_dir(), 'ckpt'))
    names = [n for n, _ in tf.train.list_variables(path)]
    self.assertIn('opt/slots/layer..w[0]/m/.ATTRIBUTES/VARIABLE_VALUE', names)
    self.assertIn('opt/num_updates/.ATTRIBUTES/VARIABLE_VALUE', names)

    v2 = tf.Variable([0.0, 0.0])
    opt2 = optimizer.Adam.Params().Instantiate()
    opt2.Build([('layer.w[0]', v2)])
    tf.train.Checkpoint(opt=opt2.checkpointables).restore(
        path).assert_consumed()
    for k, s in opt2.Slots(v2).items():
      self.assertAllEqual(s.numpy(), saved[k])
    self.assertEqual(int(opt2.num_updates.numpy()), 1)

  def testApplyUnbuiltVariable(self):
    opt = optimizer.SGD.Params().Instantiate()
    v = tf.Variable([1.0], name='stray')
    with self.assertRaisesRegex(
        ValueError, r"SGD 'sgd': variable 'stray:0' was not built; call "
        r'Build\(\)'):
      opt.Apply(0.1, [(tf.constant([1.0]), v)])

  def testBadParams(self):
    with self.assertRaisesRegex(
        ValueError, r"Adam 'adam': beta2=1.0 must be a number in \[0, 1\)"):
      optimizer.Adam.Params().Set(beta2=1.0).Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"Adam 'adam': epsilon=0.0 must be a number > 0"):
      optimizer.Adam.Params().Set(epsilon=0.0).Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"Momentum 'momentum': alpha=-0.5 must be a number in "
        r'\[0, 1\)'):
      optimizer.Momentum.Params().Set(alpha=-0.5).Instantiate()
    with self.assertRaisesWithLiteralMatch(
        ValueError, "Momentum 'momentum': use_nesterov='yes' must be True or "
        'False.'):
      optimizer.Momentum.Params().Set(use_nesterov='yes').Instantiate()
    for field in ('multiply_by_parameter_scale', 'factored'):
      with self.assertRaisesWithLiteralMatch(
          ValueError, f"Adafactor 'adafactor': {field}=1 must be True or "
          'False.'):
        optimizer.Adafactor.Params().Set(**{field: 1}).Instantiate()
    with self.assertRaisesRegex(AttributeError, r"did you mean 'beta1'"):
      optimizer.Adam.Params().Set(betta1=0.5)


class ShardTest(tf.test.TestCase):
  """Sharded slots (ZeRO-1): R optimizers, each holding shard r of every
  slot, update the weights as one whole optimizer does."""

  def _Shards(self, p, init, grads, num_shards):
    """The whole variable after `grads`, by `num_shards` optimizers each
    updating its shard (the weights re-assembled from their shards after
    every step, as the all-gather does); and each one's slots."""
    n = init.size
    c = optimizer.ShardSize(n, num_shards)
    opts, copies = [], []
    for r in range(num_shards):
      copies.append(tf.Variable(init))
      opts.append(p.Instantiate())
      opts[-1].Build([('w', copies[-1])], num_shards=num_shards,
                     shard_index=r)

    @tf.function
    def Step(g, lr, skip):
      flat_g = tf.pad(tf.reshape(g, [-1]), [[0, c * num_shards - n]])
      new = []
      for r, (opt, v) in enumerate(zip(opts, copies)):
        flat_w = tf.pad(tf.reshape(v, [-1]), [[0, c * num_shards - n]])
        new += opt.ApplyShards(lr, [(flat_g[r * c:(r + 1) * c],
                                     flat_w[r * c:(r + 1) * c], v)], skip)
      whole = tf.reshape(tf.concat(new, 0)[:n], init.shape)
      for v in copies:
        v.assign(whole)

    for i, (g, lr) in enumerate(zip(grads, _LRS)):
      Step(tf.constant(g), tf.constant(lr), tf.constant(i == 1))
    return copies[0].numpy(), opts

  def testShardsEqualTheWholeUpdate(self):
    # 7 x 5 = 35 elements: 3 shards of 12, the last padded by one.
    rng = np.random.RandomState(5)
    init = rng.randn(7, 5).astype(np.float32)
    grads = [g[0] for g in _Grads(rng, [(7, 5)])]
    for p in (optimizer.SGD.Params(),
              optimizer.Momentum.Params().Set(alpha=0.9),
              optimizer.Momentum.Params().Set(alpha=0.9, use_nesterov=True),
              optimizer.Adam.Params().Set(beta1=0.8, beta2=0.99,
                                          epsilon=1e-7)):
      with self.subTest(optimizer=p.cls.__name__,
                        nesterov=p.Get('use_nesterov') if
                        'use_nesterov' in p else None):
        whole_v = tf.Variable(init)
        whole = p.Instantiate()
        whole.Build([('w', whole_v)])
        for i, (g, lr) in enumerate(zip(grads, _LRS)):
          whole.Apply(lr, [(tf.constant(g), whole_v)],
                      skip=tf.constant(i == 1))
        got, opts = self._Shards(p, init, grads, 3)
        self.assertAllClose(whole_v.numpy(), got, rtol=1e-6, atol=1e-7)
        for name, slot in whole.Slots(whole_v).items():
          shards = [o.checkpointables.slots['w'][name] for o in opts]
          self.assertEqual([(12,)] * 3, [tuple(x.shape) for x in shards])
          flat = np.concatenate([x.numpy() for x in shards])
          self.assertAllClose(slot.numpy().ravel(), flat[:35], rtol=1e-6,
                              atol=1e-7)
          self.assertAllEqual(np.zeros(1), flat[35:])   # The padding.
        # The skipped step (the second) counted nowhere.
        self.assertEqual([2, 2, 2], [int(o.num_updates.numpy())
                                     for o in opts])

  def testShardSize(self):
    self.assertEqual([4, 3, 1, 5], [optimizer.ShardSize(n, r) for n, r in
                                    ((8, 2), (7, 3), (1, 4), (9, 2))])

  def testAdafactorCannotShard(self):
    opt = optimizer.Adafactor.Params().Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"Adafactor 'adafactor': its update reads more than "
        r'each element .* cannot be sharded; use SGD, Momentum or Adam'):
      opt.Build([('w', tf.Variable(tf.ones([4, 4])))], num_shards=2)


if __name__ == '__main__':
  tf.test.main()
