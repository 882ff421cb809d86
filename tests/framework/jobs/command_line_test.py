"""command_line: the trainer's flags checked before TensorFlow loads.

Each check is called on a plain namespace of the trainer's defaults with
one value changed; absl's own parse errors go through FlagErrorLine. The
whole trainer (exit code, one line, a real process) is
tests/trainer_bad_inputs_test.py.
"""
import subprocess
import sys
import types
import unittest

from absl import flags

from cadence.framework.jobs import command_line
from cadence.tests import test_utils

_KEY = 'synthetic.linear_regression.RegressionTiny'
_DEFAULTS = dict(
    model=_KEY, logdir='/tmp/run', mode='sync', job='trainer_and_evaler',
    run_locally='cpu', model_params_override='',
    model_params_file_override='', max_steps=None, worker_replicas=1,
    worker_split_size=None, worker_gpus=0, steps_per_loop=0, cluster_spec='',
    task_type='worker', task_index=0, peak_tflops=0.0, device_memory_gib=0.0,
    eval_timeout_s=0.0, tpu='', tpu_zone='', tpu_project='', xla=False,
    export_batch_size=None, export_max_len=None, graph_optimizer=True,
    peer_timeout_s=600.0)


def _Options(**kw):
  return types.SimpleNamespace(**dict(_DEFAULTS, **kw))


class CheckTest(unittest.TestCase):

  def testDefaultsAndGoodValuesPass(self):
    command_line.Check(_Options())
    command_line.Check(_Options(
        mode='inspect_model', logdir='', job='bogus', max_steps=0,
        worker_split_size=2, steps_per_loop=5, eval_timeout_s=1.5,
        model_params_override='task.input_dim=4;input.batch_size=8',
        cluster_spec='worker=h0:1,h1:1', task_index=1))
    # An option's flags with their option, or at their default without it.
    command_line.Check(_Options(cluster_spec='worker=h0:1,h1:1',
                                peer_timeout_s=30.0, worker_gpus=1))
    command_line.Check(_Options(peer_timeout_s=600.0, worker_gpus=1))

  def testEachBadValueIsOneLineNamingFlagValueAndRule(self):
    cases = [
        (dict(mode='train'), r"^--mode='train' is not one of sync, "),
        (dict(model=''), r'^--model is required'),
        (dict(model='synthetic.linear_regression.RegresionTiny'),
         r"^Unknown model 'synthetic\.linear_regression\.RegresionTiny'\. "
         r"Did you mean 'synthetic\.linear_regression\.RegressionTiny'"),
        (dict(logdir=''), r'^--logdir is required for --mode=sync\.$'),
        (dict(job='evaler_dve'), r"^--job='evaler_dve' is not one of .*Did "
         r"you mean 'evaler_dev'"),
        (dict(run_locally='cpus'), r"^--run_locally='cpus' is not one of "
         r"cpu, gpu\. Did you mean 'cpu'\?$"),
        (dict(run_locally='GPU'), r"^--run_locally='GPU' is not one of "
         r"cpu, gpu\. Did you mean 'gpu'"),
        (dict(max_steps=-1), r'^--max_steps=-1 must be None or an int >= 0 '),
        (dict(max_steps=2.5), r'^--max_steps=2\.5 must be None or an int'),
        (dict(worker_replicas=0), r'^--worker_replicas=0 must be an int >= '
         r'1 \(data-parallel replicas on this host\)\.$'),
        (dict(worker_replicas=True), r'^--worker_replicas=True must be an '
         r'int >= 1'),
        (dict(worker_split_size=0), r'^--worker_split_size=0 must be None '
         r'or an int >= 1'),
        (dict(worker_gpus=-2), r'^--worker_gpus=-2 must be an int >= 0'),
        (dict(steps_per_loop=-1), r'^--steps_per_loop=-1 must be an int >= '
         r'0 \(0: up to the next summary, log or checkpoint\)\.$'),
        (dict(task_index=-1), r'^--task_index=-1 must be an int >= 0'),
        (dict(eval_timeout_s=-0.5), r'^--eval_timeout_s=-0\.5 must be a '
         r'number >= 0'),
        (dict(peak_tflops=float('inf')), r'^--peak_tflops=inf must be a '
         r'number >= 0'),
        (dict(peer_timeout_s=-1.0), r'^--peer_timeout_s=-1\.0 must be a '
         r'number >= 0 \(seconds to wait for the peer hosts of a TF_CONFIG '
         r'job; 0: no limit\)\.$'),
        (dict(device_memory_gib='16'), r"^--device_memory_gib='16' must be "
         r'a number >= 0 \(GiB of memory per device; 0: no check\)\.$'),
        (dict(xla='yes'), r"^--xla='yes' must be True or False\.$"),
        (dict(graph_optimizer=0), r'^--graph_optimizer=0 must be True or '
         r'False\.$'),
        (dict(tpu_project='p'), r"^--tpu_project='p' needs --tpu"),
        (dict(peer_timeout_s=30.0), r'^--peer_timeout_s=30\.0 needs option '
         r'parameter_server \(TF_CONFIG or --cluster_spec with a "ps" job\) '
         r'or multi_worker \(.*\); this run is option local \(this host '
         r'alone: no --tpu, TF_CONFIG or --cluster_spec\)\.$'),
        (dict(tpu='t', worker_gpus=2), r'^--worker_gpus=2 needs option '
         r'parameter_server \(.*\), multi_worker \(.*\) or local \(.*\); '
         r'this run is option tpu \(--tpu\)\.$'),
        (dict(model_params_override='a=1;b'),
         r"^--model_params_override: 'b' is not 'key=value'"),
        (dict(model_params_file_override='/nonexistent/o.txt'),
         r"^--model_params_file_override='/nonexistent/o\.txt': no such "
         r'file\.$'),
        (dict(cluster_spec='worker=h0:1', task_index=3),
         r'^--task_index=3 is out of range'),
    ]
    for kw, regex in cases:
      with self.subTest(**{k: str(v) for k, v in kw.items()}):
        with self.assertRaisesRegex(command_line.UserError, regex):
          command_line.Check(_Options(**kw))


class FlagErrorLineTest(unittest.TestCase):

  def _Line(self, argv):
    values = flags.FlagValues()
    flags.DEFINE_enum('mode', 'sync', list(command_line.MODES), 'm',
                      flag_values=values)
    flags.DEFINE_string('model', '', 'm', flag_values=values)
    flags.DEFINE_integer('max_steps', None, 'm', flag_values=values)
    flags.DEFINE_float('peak_tflops', 0.0, 'm', flag_values=values)
    flags.DEFINE_bool('xla', False, 'm', flag_values=values)
    with self.assertRaises(flags.Error) as e:
      values(['trainer.py'] + argv)
    return command_line.FlagErrorLine(e.exception, values)

  def testEachAbslErrorIsOneLine(self):
    self.assertEqual('--modle=x: unknown flag. Did you mean --mode or '
                     '--model?', self._Line(['--modle=x']))
    self.assertEqual('--noxal: unknown flag. Did you mean --noxla?',
                     self._Line(['--noxal']))
    self.assertEqual('--zzz: unknown flag.', self._Line(['--zzz']))
    self.assertEqual("--mode='inspect_modle' is not one of sync, "
                     'inspect_params, inspect_model, inspect_pipeline, '
                     "export, plan. Did you mean 'inspect_model' or "
                     "'inspect_params'?",
                     self._Line(['--mode=inspect_modle']))
    self.assertEqual("--max_steps='ten' must be an int.",
                     self._Line(['--max_steps=ten']))
    self.assertEqual("--peak_tflops='fast' must be a number.",
                     self._Line(['--peak_tflops=fast']))
    self.assertEqual("--xla='sure' must be true or false.",
                     self._Line(['--xla=sure']))
    self.assertEqual('--model needs a value: --model=<value>.',
                     self._Line(['--model']))


class NoTensorFlowTest(unittest.TestCase):

  def testTheChecksImportNoTensorFlow(self):
    script = ('import sys\n'
              'from cadence.framework.jobs import command_line, tf_log\n'
              'from cadence.framework import model_registry\n'
              'model_registry.ScanKeys()\n'
              "assert 'tensorflow' not in sys.modules, 'tensorflow loaded'\n")
    subprocess.run([sys.executable, '-c', script], check=True,
                   cwd=test_utils.ROOT, timeout=120)


if __name__ == '__main__':
  unittest.main()
