"""The TPU and --xla flags through the trainer's command line.

Every case must stop the trainer before any step with exit code 2 and one
`Error: ...` line: a TPU that cannot be resolved or reached (at once, not
after gRPC's retries), flags that contradict a TPU run, --xla over several
devices per replica, and --xla on batches of unknown shape (the static
check before the first step). All run through `trainer.main` in ONE
subprocess; `--tpu=nonexistent` also runs as a real `python trainer.py`.
"""
import os

import tensorflow as tf

from cadence.tests import test_utils

_KEY = 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'
_REGRESSION = 'synthetic.linear_regression.RegressionTiny'


def _Cases(port):
  """(flags, regex of the one error line); the unreachable TPU last."""
  return [
      (['--xla', '--worker_split_size=2'],
       r"^Error: Bad params: lm's train: --xla compiles one replica's step "
       r'as one XLA program on one device, but a replica spans 2 devices'),
      (['--tpu=nonexistent'],
       r"^Error: --tpu='nonexistent': cannot resolve the TPU \(.+\)\. Give "
       r"the TPU's name \(with --tpu_zone and --tpu_project off its VM\) or "
       r'its grpc://host:8470 address\.$'),
      (['--tpu=my-tpu', '--worker_replicas=2'],
       r"^Error: --tpu='my-tpu' with --worker_replicas=2: on a TPU the "
       r'replicas are its cores / --worker_split_size; leave '
       r'--worker_replicas at 1\.$'),
      ([f'--model={_REGRESSION}', '--xla',
        '--model_params_override=input.fixed_input_shape=False'],
       r"^Error: The input of task 'regression': input batch field 'x' has "
       r'shape \[\?, 8\]: dimension 0 is not fixed; TPU and --xla need fully '
       r'defined batch shapes: set fixed_input_shape=True'),
      ([f'--tpu=grpc://127.0.0.1:{port}'],
       rf"^Error: --tpu='grpc://127.0.0.1:{port}': cannot connect to or "
       rf'initialise the TPU at grpc://127.0.0.1:{port} \(UnavailableError: '),
  ]


class TrainerTpuTest(tf.test.TestCase):

  def testTpuAndXlaErrorsExitTwoWithOneLineQuickly(self):
    logdir = os.path.join(self.get_temp_dir(), 'run')
    cases = _Cases(test_utils.FreePorts(1)[0])
    argvs = [[f'--model={_KEY}', f'--logdir={logdir}', '--job=trainer'] + f
             for f, _ in cases]
    driver = test_utils.StartTrainerMains(argvs)
    real = test_utils.StartTrainer(argvs[1])
    # A hang (gRPC retrying the unreachable TPU) would time out here.
    results = test_utils.FinishTrainerMains(driver, timeout=240)
    for (flags, regex), (code, stderr) in zip(cases, results):
      with self.subTest(flags=flags):
        test_utils.AssertUserErrorLine(self, code, stderr, regex)
        self.assertFalse(os.path.exists(os.path.join(logdir, 'train',
                                                     'checkpoint')))
    test_utils.AssertRealRunAgrees(self, real, results[1][1], timeout=300)


if __name__ == '__main__':
  tf.test.main()
