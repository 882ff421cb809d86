"""Bad inputs through the real trainer: exit 2, one line, nothing touched.

A table of bad command lines: flags, the experiment key, the job, numbers
out of range, overrides, $TF_CONFIG and --cluster_spec, experiment and
input params, TPU and --xla settings. Every row must stop the trainer
before any step with exit code 2 and exactly one `Error: ...` line (the
last) that names the input, the value and the rule, without a traceback,
and leave a logdir it was given byte-identical (test_utils.RunBadInputs).

Rows are grouped by what the trainer must load to see the error; each
group runs through `trainer.py`'s flag parsing and `main` in ONE
subprocess, and its rows marked `real` also as real `python trainer.py`
processes:

  _BEFORE_TF  flags, the experiment key, the job, numbers, overrides, the
              params file, the cluster: answered before TensorFlow is
              imported (the driver reports it was never imported).
  _MODEL      the experiment's params and its input's (each layer and
              input generator names its params path), then the devices:
              --xla and the TPU (an unreachable TPU last: connecting
              changes the process).

Rows of `badinput_exps` run a user's own package (_USER_FILES, outside
the checkout, on PYTHONPATH) by its full key.

To add a case, add a row: BadInput(name, argv, regex[, prepare, env,
real]); '{logdir}' in argv is the row's own logdir.
"""
import json
import os
import subprocess
import sys

import tensorflow as tf

from cadence.tests import test_utils

BadInput = test_utils.BadInput

_LM = 'lm.one_billion_wds.OneBWdsGPipeTransformerTiny'
_REGRESSION = 'synthetic.linear_regression.RegressionTiny'
_IMAGE = 'image.shapes_resnet.ShapesResNetTiny'
_PIPELINED_MLP = 'examples.pipelined_mlp.PipelinedMlp'
_UNITS = 'task.net_tpl.units'
_LOGDIR = '--logdir={logdir}'
_STACK = 'task.stack_tpl'
_PIPE = 'task.stack_tpl.pipeline_tpl'
_LAYER = 'task.stack_tpl.transformer_tpl'
# A user's own package, written beside the logdirs and put on PYTHONPATH.
_USER_FILES = {
    'badinput_exps/__init__.py': '',
    'badinput_exps/exps.py': (
        'from cadence.framework import model_registry\n'
        'from cadence.params.synthetic import linear_regression\n\n\n'
        '@model_registry.RegisterSingleTaskModel\n'
        'class MyRegression(linear_regression.RegressionTiny):\n'
        '  INPUT_DIM = 4\n\n\n'
        'class Unregistered(linear_regression.RegressionTiny):\n'
        '  pass\n'),
    'badinput_exps/broken.py': (
        'from cadence.framework import model_registry\n\n\n'
        '@model_registry.RegisterSingleTaskModel\n'
        'class Broken\n'
        '  pass\n'),
    'badinput_exps/raises.py': (
        'from cadence.framework import model_registry\n'
        'from cadence.params.synthetic import linear_regression\n\n\n'
        '@model_registry.RegisterSingleTaskModel\n'
        'class Raises(linear_regression.RegressionTiny):\n'
        '  WIDTH = undefined_width\n'),
}
# Rejected before any server starts, so nothing listens on these.
_HOSTS = ['127.0.0.1:2222', '127.0.0.1:2223']


def _TfConfig(cluster=None, task=None, text=None):
  """A row's environment with $TF_CONFIG: `text`, or the JSON of
  cluster/task (worker 0 of two workers by default)."""
  if text is None:
    text = json.dumps({'cluster': cluster or {'worker': _HOSTS},
                       'task': task or {'type': 'worker', 'index': 0}})
  return {'TF_CONFIG': text}


def _PreviousRun(logdir):
  """A logdir some earlier command left: it must stay as it is."""
  with open(os.path.join(logdir, 'params.txt'), 'w') as f:
    f.write('task.train.max_steps : 7\n')
  os.makedirs(os.path.join(logdir, 'notes'))
  with open(os.path.join(logdir, 'notes', 'todo.txt'), 'w') as f:
    f.write('compare with the baseline\n')


def _BinaryFile(logdir):
  _PreviousRun(logdir)
  with open(os.path.join(logdir, 'override.bin'), 'wb') as f:
    f.write(bytes(range(256)))


def _BlankFile(logdir):
  """A text file of blank lines (blank.txt) and one of sentences
  (text.txt) in the logdir, which must then stay as it is."""
  with open(os.path.join(logdir, 'blank.txt'), 'w') as f:
    f.write('\n\n   \n\n')
  with open(os.path.join(logdir, 'text.txt'), 'w') as f:
    f.write('\n'.join(f'the cat number {i} sees the dog' for i in range(50)))


# Processes holding a row's logdir lock, stopped when the test ends.
_HOLDERS = []


def _HeldByAnotherTrainer(logdir):
  """Another live process holds the logdir's writer lock (as a trainer
  does while it runs), with the record a trainer writes."""
  proc = subprocess.Popen(
      [sys.executable, '-c', 'import sys, time\n'
       'from cadence.framework.train import logdir_lock\n'
       'lock = logdir_lock.WriterLock(sys.argv[1])\n'
       'print("held", flush=True)\n'
       'time.sleep(600)\n', logdir],
      cwd=test_utils.ROOT, stdout=subprocess.PIPE, text=True)
  _HOLDERS.append(proc)
  assert proc.stdout.readline().strip() == 'held'


def _FileAsLogdir(logdir):
  with open(os.path.join(logdir, 'run'), 'w') as f:
    f.write('not a folder\n')


def _Lm(*flags):
  return [f'--model={_LM}', _LOGDIR] + list(flags)


def _Own(experiment, *flags):
  """An experiment of tests/bad_units.py, by its dotted path."""
  return [f'--model=cadence.tests.bad_units.{experiment}', _LOGDIR] + list(
      flags)


_BEFORE_TF = [
    BadInput('misspelt_flag', [f'--modle={_LM}', _LOGDIR],
             rf'^Error: --modle={_LM}: unknown flag\. Did you mean --mode '
             r'or --model\?$', real=True),
    BadInput('misspelt_bool_flag', _Lm('--noxal'),
             r'^Error: --noxal: unknown flag\. Did you mean --noxla\?$'),
    BadInput('flag_without_value', [_LOGDIR, '--model'],
             r'^Error: --model needs a value: --model=<value>\.$'),
    BadInput('positional_argument', _Lm('trainer'),
             r"^Error: unexpected arguments \['trainer'\]$"),
    BadInput('unknown_experiment',
             ['--model=lm.one_billion_wds.OneBWdsGPipeTransformerTiy',
              _LOGDIR],
             r"^Error: Unknown model 'lm\.one_billion_wds\."
             r"OneBWdsGPipeTransformerTiy'\. Did you mean 'lm\.one_billion_wds"
             r"\.OneBWdsGPipeTransformerTiny'", prepare=_PreviousRun),
    # A user's experiment by its full key (_USER_FILES).
    BadInput('user_experiment_misspelt',
             ['--model=badinput_exps.exps.MyRegresion', _LOGDIR],
             r"^Error: Unknown model 'badinput_exps\.exps\.MyRegresion'\. Did "
             r"you mean 'badinput_exps\.exps\.MyRegression'\?$", real=True),
    BadInput('user_module_misspelt',
             ['--model=badinput_exps.exp.MyRegression', _LOGDIR],
             r"^Error: Unknown model 'badinput_exps\.exp\.MyRegression': no "
             r'module badinput_exps\.exp under cadence\.params or on the '
             r"Python path\. Did you mean 'badinput_exps\.exps\."
             r"MyRegression'[,?]"),
    BadInput('user_class_not_registered',
             ['--model=badinput_exps.exps.Unregistered', _LOGDIR],
             r"^Error: Model 'badinput_exps\.exps\.Unregistered': class "
             r'Unregistered \(.*/badinput_exps/exps\.py, line 10\) is not a '
             r'registered experiment: decorate it with @model_registry\.'
             r'RegisterSingleTaskModel'),
    BadInput('user_module_does_not_parse',
             ['--model=badinput_exps.broken.Broken', _LOGDIR],
             r"^Error: Model 'badinput_exps\.broken\.Broken': cannot import "
             r'badinput_exps\.broken: .*/badinput_exps/broken\.py, line 5: '
             r"SyntaxError: expected ':'\.$", prepare=_PreviousRun,
             real=True),
    BadInput('no_model', [_LOGDIR],
             r'^Error: --model is required: a registered experiment key'),
    BadInput('no_logdir', [f'--model={_LM}'],
             r'^Error: --logdir is required for --mode=sync\.$'),
    BadInput('logdir_is_a_file', [f'--model={_LM}', '--logdir={logdir}/run'],
             r"^Error: --logdir='.*/run' is a file; it must be a folder",
             prepare=_FileAsLogdir),
    BadInput('unknown_mode', _Lm('--mode=train'),
             r"^Error: --mode='train' is not one of sync, inspect_params, "
             r'inspect_model, inspect_pipeline, export, plan\.$'),
    BadInput('job_typo', _Lm('--job=trainer_and_eval'),
             r"^Error: --job='trainer_and_eval' is not one of trainer, "
             r'trainer_and_evaler, evaler_<dataset>, decoder_<dataset> '
             r"\(datasets: Train, Dev, Test\)\. Did you mean "
             r"'trainer_and_evaler'", prepare=_PreviousRun),
    BadInput('job_unknown_dataset', _Lm('--job=evaler_valid'),
             r"^Error: --job='evaler_valid' is not one of"),
    BadInput('unknown_run_locally', _Lm('--run_locally=cpus'),
             r"^Error: --run_locally='cpus' is not one of cpu, gpu\. Did you "
             r"mean 'cpu'\?$"),
    BadInput('steps_per_loop_negative', _Lm('--steps_per_loop=-1'),
             r'^Error: --steps_per_loop=-1 must be an int >= 0 \(0: up to '
             r'the next summary, log or checkpoint\)\.$', real=True),
    BadInput('steps_per_loop_negative_regression',
             [f'--model={_REGRESSION}', _LOGDIR, '--steps_per_loop=-3'],
             r'^Error: --steps_per_loop=-3 must be an int >= 0'),
    BadInput('max_steps_negative', _Lm('--max_steps=-5'),
             r'^Error: --max_steps=-5 must be None or an int >= 0 '
             r'\(overrides task\.train\.max_steps\)\.$',
             prepare=_PreviousRun),
    BadInput('max_steps_not_an_int', _Lm('--max_steps=1e3'),
             r"^Error: --max_steps='1e3' must be an int\.$"),
    BadInput('worker_replicas_zero', _Lm('--worker_replicas=0'),
             r'^Error: --worker_replicas=0 must be an int >= 1 '
             r'\(data-parallel replicas on this host\)\.$'),
    BadInput('worker_split_size_zero', _Lm('--worker_split_size=0'),
             r'^Error: --worker_split_size=0 must be None or an int >= 1 '
             r'\(devices per replica\)\.$'),
    BadInput('worker_gpus_negative', _Lm('--worker_gpus=-1'),
             r'^Error: --worker_gpus=-1 must be an int >= 0'),
    BadInput('eval_timeout_negative', _Lm('--eval_timeout_s=-1'),
             r'^Error: --eval_timeout_s=-1\.0 must be a number >= 0 '
             r'\(seconds without a new checkpoint; 0: no timeout\)\.$'),
    BadInput('peak_tflops_nan', _Lm('--peak_tflops=nan'),
             r'^Error: --peak_tflops=nan must be a number >= 0'),
    BadInput('device_memory_negative', _Lm('--device_memory_gib=-2'),
             r'^Error: --device_memory_gib=-2\.0 must be a number >= 0 '
             r'\(GiB of memory per device; 0: no check\)\.$'),
    BadInput('xla_not_a_bool', _Lm('--xla=maybe'),
             r"^Error: --xla='maybe' must be true or false\.$"),
    BadInput('tpu_zone_without_tpu', _Lm('--tpu_zone=us-central1-b'),
             r"^Error: --tpu_zone='us-central1-b' needs --tpu"),
    # An option's own flag when another option runs (a flag at its default
    # is not given: --peer_timeout_s=600 would pass).
    BadInput('peer_timeout_without_tf_config', _Lm('--peer_timeout_s=30'),
             r'^Error: --peer_timeout_s=30\.0 needs option parameter_server '
             r'\(TF_CONFIG or --cluster_spec with a "ps" job\) or '
             r'multi_worker \(TF_CONFIG or --cluster_spec without a "ps" '
             r'job\); this run is option local \(this host alone: no --tpu, '
             r'TF_CONFIG or --cluster_spec\)\.$', prepare=_PreviousRun,
             real=True),
    BadInput('worker_gpus_with_tpu', _Lm('--tpu=my-tpu', '--worker_gpus=2'),
             r'^Error: --worker_gpus=2 needs option parameter_server \(.*\), '
             r'multi_worker \(.*\) or local \(.*\); this run is option tpu '
             r'\(--tpu\)\.$'),
    BadInput('override_not_key_value',
             _Lm('--model_params_override=task.model_dim'),
             r"^Error: --model_params_override: 'task\.model_dim' is not "
             r"'key=value' \(items are separated by ';'\)\.$"),
    BadInput('params_file_missing',
             _Lm('--model_params_file_override={logdir}/none.txt'),
             r"^Error: --model_params_file_override='.*/none\.txt': no such "
             r'file\.$'),
    BadInput('params_file_binary',
             _Lm('--model_params_file_override={logdir}/override.bin'),
             r"^Error: --model_params_file_override='.*/override\.bin' is not "
             r'UTF-8 text \(byte 128: invalid start byte\); it must hold '
             r"Params text", prepare=_BinaryFile, real=True),
    BadInput('params_file_is_a_folder',
             _Lm('--model_params_file_override={logdir}/notes'),
             r"^Error: --model_params_file_override='.*/notes' is not a "
             r'file', prepare=_PreviousRun),
    BadInput('tf_config_index_minus_one',
             _Lm(), r"^Error: \$TF_CONFIG task index=-1 is out of range: job "
             r"'worker' has 2 task\(s\), so the index is in \[0, 1\]\.$",
             env=_TfConfig(task={'type': 'worker', 'index': -1}),
             prepare=_PreviousRun, real=True),
    BadInput('tf_config_index_too_large',
             _Lm(), r'^Error: \$TF_CONFIG task index=2 is out of range',
             env=_TfConfig(task={'type': 'worker', 'index': 2})),
    BadInput('tf_config_not_json', _Lm(),
             r'^Error: \$TF_CONFIG is not JSON \(Expecting value: line 1 '
             r'column 13 \(char 12\)\)',
             env=_TfConfig(text='{"cluster": ')),
    BadInput('tf_config_no_cluster', _Lm(),
             r'^Error: \$TF_CONFIG has no "cluster" entry',
             env=_TfConfig(text='{"task": {"type": "worker", "index": 0}}')),
    BadInput('tf_config_unknown_task_type', _Lm(),
             r"^Error: \$TF_CONFIG task type='wroker' is not a job of the "
             r"cluster \('worker'\)\. Did you mean 'worker'\?$",
             env=_TfConfig(task={'type': 'wroker', 'index': 0})),
    BadInput('tf_config_unknown_job', _Lm(),
             r"^Error: \$TF_CONFIG: job 'workers' is not one of 'chief', "
             r"'worker', 'ps', 'evaluator'\. Did you mean 'worker'\?$",
             env=_TfConfig(cluster={'workers': _HOSTS})),
    BadInput('tf_config_duplicate_address', _Lm(),
             r"^Error: \$TF_CONFIG: address '127\.0\.0\.1:2222' is given "
             r'twice, for worker 0 and worker 1',
             env=_TfConfig(cluster={'worker': [_HOSTS[0]] * 2})),
    # Two spellings of one IP and port (host names are resolved first).
    BadInput('tf_config_same_address_two_spellings', _Lm(),
             r"^Error: \$TF_CONFIG: address '127\.0\.0\.1:2222' is given "
             r"twice, for worker 0 \(as 'localhost:2222', both "
             r'127\.0\.0\.1:2222\) and worker 1; each task needs its own '
             r'host:port\.$',
             env=_TfConfig(cluster={'worker': ['localhost:2222',
                                               _HOSTS[0]]}), real=True),
    BadInput('tf_config_bad_port', _Lm(),
             r"^Error: \$TF_CONFIG: worker 1 address '127\.0\.0\.1:99999' "
             r"must be 'host:port' with a port in \[1, 65535\]",
             env=_TfConfig(cluster={'worker': [_HOSTS[0],
                                               '127.0.0.1:99999']})),
    BadInput('cluster_spec_malformed', _Lm('--cluster_spec=worker'),
             r"^Error: --cluster_spec='worker': 'worker' is not "
             r"'job=host:port\[,host:port\.\.\.\]'"),
    BadInput('cluster_spec_no_port',
             _Lm('--cluster_spec=worker=127.0.0.1'),
             r"^Error: --cluster_spec='worker=127\.0\.0\.1': worker 0 address "
             r"'127\.0\.0\.1' must be 'host:port'"),
    BadInput('cluster_spec_task_index', _Lm(
        f'--cluster_spec=worker={",".join(_HOSTS)}', '--task_index=5'),
             r'^Error: --task_index=5 is out of range: job \'worker\' has 2 '
             r'task\(s\), so the index is in \[0, 1\]\.$'),
    BadInput('cluster_spec_task_type', _Lm(
        f'--cluster_spec=worker={",".join(_HOSTS)}', '--task_type=chief'),
             r"^Error: --task_type='chief' is not a job of the cluster "
             r"\('worker'\)\.$"),
    # absl keeps a repeated flag's last value and drops the others.
    BadInput('override_given_twice', _Lm(
        f'--model_params_override={_LAYER}.hidden_dim=256',
        '--model_params_override=input.batch_size=16'),
             r"^Error: --model_params_override is given 2 times \(--model_"
             rf'params_override={_LAYER}\.hidden_dim=256, --model_params_'
             r'override=input\.batch_size=16\); absl would keep only the '
             r"last\. Give it once \(join its items with ';' into one "
             r'value\)\.$', prepare=_PreviousRun, real=True),
    BadInput('bool_flag_and_its_negation', _Lm('--xla', '--noxla'),
             r'^Error: --xla is given 2 times \(--xla, --noxla\); absl would '
             r'keep only the last\. Give it once\.$'),
    BadInput('logdir_given_twice', _Lm('--logdir={logdir}/other'),
             r'^Error: --logdir is given 2 times'),
    # Another trainer holds the logdir: answered before TensorFlow loads.
    BadInput('logdir_in_use', _Lm(),
             r"^Error: --logdir .*/logdir_in_use is in use by another "
             r'trainer \(host \S+, pid \d+, started [\d-]+ [\d:]+ UTC; lock '
             r'file .*/\.writer\.lock\): one logdir has one writer\.',
             prepare=_HeldByAnotherTrainer, real=True),
    # --mode=plan's cluster (framework/planning/hardware.py) and flags.
    BadInput('plan_cluster_misspelt_preset',
             _Lm('--mode=plan', '--plan_cluster=h100'),
             r"^Error: --plan_cluster: 'h100' is not a preset \(one of cpu, "
             r"h100x8, a100x8, tpu_v4_8, tpu_v5e_8\) nor a key=value item\. "
             r"Did you mean 'h100x8'\?$", real=True),
    BadInput('plan_cluster_unknown_key',
             _Lm('--mode=plan', '--plan_cluster=h100x8,devcies=4'),
             r"^Error: --plan_cluster: unknown key 'devcies'; the keys are "
             r"devices, .*\. Did you mean 'devices'\?$"),
    BadInput('plan_cluster_bad_value',
             _Lm('--mode=plan', '--plan_cluster=h100x8,efficiency=2'),
             r"^Error: --plan_cluster: efficiency='2' must be a number in "
             r"\(0, 1\] \(the share of peak a layer's products reach\)\.$"),
    BadInput('plan_cluster_hosts',
             _Lm('--mode=plan', '--plan_cluster=h100x8,hosts=3'),
             r'^Error: --plan_cluster: hosts=3 must divide devices=8\.$'),
    BadInput('plan_flag_without_plan_mode', _Lm('--plan_measure'),
             r'^Error: --plan_measure need\(s\) --mode=plan \(now '
             r'--mode=sync\)\.$'),
    BadInput('plan_top_zero', _Lm('--mode=plan', '--plan_top=0'),
             r'^Error: --plan_top=0 must be an int >= 1\.$'),
    BadInput('plan_explain_negative', _Lm('--mode=plan', '--plan_explain=-1'),
             r'^Error: --plan_explain=-1 must be an int >= 0\.$'),
    BadInput('plan_apply_no_folder',
             _Lm('--mode=plan', '--plan_apply=/no/such/folder/plan.txt'),
             r"^Error: --plan_apply='/no/such/folder/plan\.txt' must be a "
             r'file path in an existing folder'),
]

_INPUT = r"^Error: Input: LmCorpusInput 'lm_train' \(params 'input'\): "
_MODEL = [
    # Layouts: stages that do not fit a replica's devices. The line names
    # where the devices came from (the flag as typed, or the experiment's
    # WORKER_SPLIT_SIZE) and the fixes. First in the group: the process
    # makes 4 logical CPUs at its first device set-up, and later rows take
    # the 1 or 2 they need of them.
    BadInput('split_too_big', _Lm('--worker_split_size=4'),
             rf"^Error: Bad params: PipeliningLayer \(params '{_PIPE}'\): "
             r"schedule='gpipe' with 2 stages, 4 devices and 4 micro-batches: "
             r"Schedule 'gpipe': 2 stage\(s\) on 4 devices leave device\(s\) "
             r'\[2, 3\] idle\. --worker_split_size=4 gives a replica 4 '
             r'devices: use --worker_split_size=2, or cut the model into 4 '
             rf'stages \({_STACK}\.splits=4\)\.$', prepare=_PreviousRun,
             real=True),
    BadInput('split_too_big_inspect_model',
             _Lm('--mode=inspect_model', '--worker_split_size=4'),
             rf"^Error: Bad params: PipeliningLayer 'lm\.stack\.pipeline' "
             rf"\(params '{_PIPE}'\): 2 pipeline cell\(s\) on a model split "
             r'of 4 devices would leave 2 device\(s\) idle\. '
             r'--worker_split_size=4 gives a replica 4 devices: use '
             r'--worker_split_size=2, or cut the model into 4 stages '
             rf'\({_STACK}\.splits=4\)\.$'),
    BadInput('interleaved_split_too_big', _Lm(
        '--worker_split_size=4', f'--model_params_override={_PIPE}.schedule='
        f'interleaved_1f1b;{_PIPE}.stages_per_device=2'),
             rf"\(params '{_PIPE}'\): stages_per_device=2 needs 4 devices x 2 "
             r'= 8 cells; got 4\. --worker_split_size=4 gives a replica 4 '
             r'devices: use --worker_split_size=2\.$'),
    BadInput('experiments_split_too_big',
             _Lm(f'--model_params_override={_STACK}.splits=1'),
             r"Schedule 'gpipe': 1 stage\(s\) on 2 devices leave device\(s\) "
             r"\[1\] idle\. The experiment's WORKER_SPLIT_SIZE=2 gives a "
             r'replica 2 devices: use --worker_split_size=1, or cut the model '
             rf'into 2 stages \({_STACK}\.splits=2\)\.$'),
    BadInput('table_lines_not_the_devices', _Lm(
        f'--model_params_override={_PIPE}.schedule=table;'
        f"{_PIPE}.schedule_table='" + ' '.join(
            f'F0:{m} F1:{m} B1:{m} B0:{m}' for m in range(4)) + "'"),
             r"Schedule 'table': the table has 1 line\(s\); the pipeline has "
             r"2 devices \(one line per device\)\. The experiment's "
             r'WORKER_SPLIT_SIZE=2 gives a replica 2 devices: use '
             r'--worker_split_size=1, or a schedule_table of 2 lines\.$'),
    BadInput('user_module_fails_to_import',
             ['--model=badinput_exps.raises.Raises', _LOGDIR],
             r"^Error: Model 'badinput_exps\.raises\.Raises': cannot import "
             r'badinput_exps\.raises: .*/badinput_exps/raises\.py, line 7: '
             r"NameError: name 'undefined_width' is not defined\.$",
             prepare=_PreviousRun),
    # The experiment's params, each checked by the layer that owns it.
    BadInput('override_unknown_key',
             _Lm('--model_params_override=task.num_micro_batches=3'),
             r"^Error: --model_params_override: Params 'task' has no param "
             rf"'num_micro_batches'; did you mean '{_PIPE}\.num_micro_batches'"
             r'\?$', prepare=_PreviousRun, real=True),
    BadInput('micro_batches_do_not_divide',
             _Lm(f'--model_params_override={_PIPE}.num_micro_batches=3'),
             rf"PipeliningLayer \(params '{_PIPE}'\): num_micro_batches=3 "
             r'does not divide batch 32 \(inputs dim batch_dim=0\)\.'),
    BadInput('micro_batch_size',
             _Lm(f'--model_params_override={_PIPE}.micro_batch_size=5'),
             rf"\(params '{_PIPE}'\): micro_batch_size=5 \* num_micro_batches"
             r'=4 = 20 != batch 32'),
    BadInput('remat_unknown',
             _Lm(f'--model_params_override={_PIPE}.remat=sometimes'),
             rf"\(params '{_PIPE}'\): remat='sometimes' must be one of "
             r"'except_last', 'always', 'never', 'selective'\."),
    BadInput('schedule_case',
             _Lm(f'--model_params_override={_PIPE}.schedule=1F1B'),
             rf"\(params '{_PIPE}'\): schedule='1F1B' must be one of "
             r"'gpipe', '1f1b', 'interleaved_1f1b', 'zb_h1', 'zb_v', 'table'\. "
             r"Did you mean '1f1b'\?"),
    BadInput('schedule_zb_v_one_stage_per_device',
             _Lm(f'--model_params_override={_PIPE}.schedule=zb_v'),
             rf"\(params '{_PIPE}'\): schedule='zb_v' with 2 stages, 2 "
             r"devices and 4 micro-batches: Schedule 'zb_v': a V places 2 "
             r'stages per device: num_stages=2 must be 2 x num_devices=2 '
             r'\(on a PipeliningLayer: stages_per_device=2\)\.$'),
    BadInput('schedule_table_unfinished',
             _Lm(f'--model_params_override={_PIPE}.schedule=table;'
                 f"{_PIPE}.schedule_table='F0:0 F0:1 F0:2 F0:3 B0:0 B0:1 "
                 "B0:2 B0:3 | F1:0 B1:0 F1:1 B1:1 F1:2 B1:2 F1:3'"),
             rf"\(params '{_PIPE}'\): schedule_table='.*' with 2 stages, 2 "
             r"devices and 4 micro-batches: Schedule 'table', device 1: "
             r'micro-batch 3 never finishes stage 1: B\(1, 3\) is missing\.$'),
    BadInput('schedule_table_not_an_action',
             _Lm(f'--model_params_override={_PIPE}.schedule=table;'
                 f"{_PIPE}.schedule_table='F0:0 X0:1'"),
             rf"\(params '{_PIPE}'\): schedule_table='F0:0 X0:1' .*device 0, "
             r"action 2: 'X0:1' is not an action written kind "
             r'stage:micro_batch'),
    BadInput('backward_window_zero',
             _Lm(f'--model_params_override={_PIPE}.backward_window=0'),
             rf"\(params '{_PIPE}'\): backward_window=0 must be None or an "
             r'int >= 1'),
    BadInput('splits_too_many',
             _Lm(f'--model_params_override={_STACK}.splits=5'),
             rf"GPipeTransformerStack 'stack' \(params '{_STACK}'\): splits=5 "
             r'must be in \[1, num_layers=4\]; each cell needs a layer\.'),
    BadInput('splits_not_increasing',
             _Lm(f'--model_params_override={_STACK}.splits=[2,2]'),
             rf"\(params '{_STACK}'\): splits=\[2, 2\] must be an int K in "
             r'\[1, 4\] or a list of increasing layer indices in \(0, 4\)'),
    BadInput('num_layers_zero',
             _Lm(f'--model_params_override={_STACK}.num_layers=0'),
             rf"\(params '{_STACK}'\): num_layers=0 must be an int >= 1\."),
    BadInput('num_heads_do_not_divide',
             _Lm(f'--model_params_override={_LAYER}.num_heads=3'),
             rf"\(params '{_LAYER}'\): num_heads=3 must divide input_dim=128; "
             r'128 % 3 = 2\.'),
    BadInput('hidden_dim_zero',
             _Lm(f'--model_params_override={_LAYER}.hidden_dim=0'),
             rf"\(params '{_LAYER}'\): hidden_dim=0 must be an int >= 1\."),
    BadInput('hidden_dim_a_string',
             _Lm(f"--model_params_override={_LAYER}.hidden_dim='512'"),
             rf"\(params '{_LAYER}'\): hidden_dim='512' must be an int >= "
             r'1\.$'),
    BadInput('dropout_above_one',
             _Lm(f'--model_params_override={_LAYER}.atten_dropout_prob=1.5'),
             rf"\(params '{_LAYER}'\): atten_dropout_prob=1.5 must be a "
             r'probability in \[0, 1\)\.'),
    BadInput('activation_typo',
             _Lm(f'--model_params_override={_LAYER}.activation=RELUU'),
             rf"\(params '{_LAYER}'\): activation='RELUU' is invalid: .*Did "
             r"you mean 'RELU'\?"),
    BadInput('model_dim_zero', _Lm('--model_params_override=task.model_dim=0'),
             r"LanguageModel 'lm' \(params 'task'\): model_dim=0 must be an "
             r'int >= 1\.'),
    BadInput('label_smoothing_with_chunks', _Lm(
        '--model_params_override=task.label_smoothing=0.1;'
        'task.softmax_max_alloc=100'),
             r"\(params 'task'\): label_smoothing=0.1 needs "
             r'softmax_max_alloc=0'),
    BadInput('temperature_zero',
             _Lm('--model_params_override=task.decoder.temperature=0'),
             r"\(params 'task'\): decoder\.temperature=0 must be a number > "
             r'0\.'),
    # A learner's or an input's error on an existing logdir: its params.txt
    # and the rest stay as they were (every check runs before any write).
    BadInput('learning_rate_negative', _Lm(
        '--model_params_override=task.train.learner.learning_rate=-1'),
             r"Learner 'learner' \(params 'task\.train\.learner'\): "
             r'learning_rate=-1 must be a number >= 0\.',
             prepare=_PreviousRun, real=True),
    # The input's params, named by the key to override.
    BadInput('max_seq_len_a_string',
             _Lm("--model_params_override=input.max_seq_len='64'"),
             _INPUT + r"max_seq_len='64' must be an int >= 1\.$", real=True),
    BadInput('batch_size_a_float',
             _Lm('--model_params_override=input.batch_size=32.5'),
             _INPUT + r'batch_size=32\.5 must be an int >= 1\.$'),
    BadInput('batch_size_negative',
             _Lm('--model_params_override=input.batch_size=-1'),
             _INPUT + r'batch_size=-1 must be an int >= 1\.$',
             prepare=_PreviousRun),
    BadInput('corpus_typo', _Lm('--model_params_override=input.corpus=synth'),
             _INPUT + r"corpus='synth' must be one of '', 'synthetic', "
             r"'one_billion_words'\. Did you mean 'synthetic'\?$"),
    BadInput('regression_noise_negative',
             [f'--model={_REGRESSION}', _LOGDIR,
              '--model_params_override=input.noise_stddev=-1'],
             r"^Error: Input: RegressionInput 'input' \(params 'input'\): "
             r'noise_stddev=-1 must be a number >= 0\.$'),
    BadInput('regression_hidden_dim_a_float',
             [f'--model={_REGRESSION}', _LOGDIR,
              '--model_params_override=task.hidden_dims=[16.5]'],
             r"^Error: Bad params: RegressionModel 'regression' \(params "
             r"'task'\): hidden_dims\[0\]=16\.5 must be an int >= 1\.$"),
    # --mode=plan of a model without a pipeline to lay out.
    BadInput('plan_without_pipeline',
             [f'--model={_REGRESSION}', _LOGDIR, '--mode=plan',
              '--plan_cluster=h100x8'],
             r"^Error: --mode=plan: model 'regression' runs no pipeline "
             r'.*GPipeTransformerStack\.$'),
    # Dtypes: a DType, one of those a layer computes in (base_layer.py).
    BadInput('fprop_dtype_misspelt',
             _Lm('--model_params_override=task.fprop_dtype=tf.bfloat17'),
             r"^Error: Bad params: LanguageModel 'lm' \(params 'task'\): "
             r"fprop_dtype='tf\.bfloat17' must be one of None, tf\.float32, "
             r'tf\.bfloat16 \(tf\.float16 is not supported: .*\)\. Did you '
             r'mean tf\.bfloat16\?$', prepare=_PreviousRun, real=True),
    BadInput('fprop_dtype_a_string',
             _Lm("--model_params_override=task.fprop_dtype='bfloat16'"),
             r"\(params 'task'\): fprop_dtype='bfloat16' must be one of .* "
             r'Did you mean tf\.bfloat16 \(a dtype, not a string\)\?$'),
    BadInput('fprop_dtype_int32',
             _Lm('--model_params_override=task.fprop_dtype=tf.int32'),
             r"\(params 'task'\): fprop_dtype=tf\.int32 must be one of None, "
             r'tf\.float32, tf\.bfloat16 '),
    BadInput('fprop_dtype_float16_on_the_stack',
             _Lm(f'--model_params_override={_STACK}.fprop_dtype=tf.float16'),
             rf"GPipeTransformerStack 'stack' \(params '{_STACK}'\): "
             r'fprop_dtype=tf\.float16 must be one of None, tf\.float32, '
             r'tf\.bfloat16 \(tf\.float16 is not supported: its range '
             r'underflows small gradients without loss scaling; use '
             r'tf\.bfloat16\)\.$'),
    BadInput('variables_dtype_bfloat16',
             _Lm('--model_params_override=task.dtype=tf.bfloat16'),
             r"\(params 'task'\): dtype=tf\.bfloat16 must be one of "
             r'tf\.float32, tf\.float64\.$'),
    # stages_per_device names the knob the user set and what to lower.
    BadInput('stages_per_device_too_many', _Lm(
        f'--model_params_override={_PIPE}.schedule=interleaved_1f1b;'
        f'{_PIPE}.stages_per_device=3'),
             rf"\(params '{_STACK}'\): splits=2 with stages_per_device=3 "
             rf"\(params '{_PIPE}'\) makes 2 x 3 = 6 cells, more than the 4 "
             r'layers \(each cell needs a layer\); lower stages_per_device '
             r'to at most 2\.$'),
    BadInput('stages_per_device_zero', _Lm(
        f'--model_params_override={_PIPE}.stages_per_device=0'),
             rf"PipeliningLayer \(params '{_PIPE}'\): stages_per_device=0 "
             r'must be an int >= 1\.$'),
    # Text files with blank lines only: the data's fault, by params path.
    BadInput('blank_tokenizer_training_file', _Lm(
        "--model_params_override=input.corpus='';"
        'input.file_pattern={logdir}/blank.txt;'
        'input.tokenizer.train_file_pattern={logdir}/blank.txt'),
             r"^Error: Input: SentencePieceTokenizer 'tokenizer' \(params "
             r"'input\.tokenizer'\): train_file_pattern='.*/blank\.txt' has "
             r'no sentences to train on: its 1 file\(s\) hold 4 lines, all '
             r'blank; point it at text with one sentence a line\.$',
             prepare=_BlankFile),
    BadInput('blank_training_file', _Lm(
        "--model_params_override=input.corpus='';"
        'input.file_pattern={logdir}/blank.txt;'
        'input.tokenizer.train_file_pattern={logdir}/text.txt'),
             r"^Error: Input: LmCorpusInput 'lm_(train|dev)' \(params "
             r"'input'\): file_pattern='.*/blank\.txt' has no sentences: its "
             r'1 file\(s\) hold 4 lines, all blank; point it at text with '
             r'one sentence a line\.$', prepare=_BlankFile, real=True),
    BadInput('tokenizer_without_training_text', _Lm(
        "--model_params_override=input.corpus='';"
        'input.file_pattern={logdir}/text.txt'),
             r"^Error: Bad params: SentencePieceTokenizer 'tokenizer' "
             r"\(params 'input\.tokenizer'\): set model_file or "
             r'train_file_pattern', prepare=_BlankFile),
    # Every mode runs the same params checks before it does anything.
    BadInput('plan_unknown_schedule', _Lm(
        '--mode=plan', f'--model_params_override={_PIPE}.schedule=zb_x'),
             rf"\(params '{_PIPE}'\): schedule='zb_x' must be one of 'gpipe', "
             r".*Did you mean 'zb_v'\?$", prepare=_PreviousRun),
    BadInput('inspect_model_bad_params', _Lm(
        '--mode=inspect_model',
        f'--model_params_override={_PIPE}.num_micro_batches=3'),
             rf"\(params '{_PIPE}'\): num_micro_batches=3 does not divide "
             r'batch 32', prepare=_PreviousRun),
    BadInput('inspect_params_bad_params', _Lm(
        '--mode=inspect_params',
        f'--model_params_override={_PIPE}.num_micro_batches=3'),
             rf"\(params '{_PIPE}'\): num_micro_batches=3 does not divide "
             r'batch 32', prepare=_PreviousRun),
    BadInput('inspect_pipeline_bad_params', _Lm(
        '--mode=inspect_pipeline',
        f'--model_params_override={_PIPE}.remat=sometimes'),
             rf"\(params '{_PIPE}'\): remat='sometimes' must be one of",
             prepare=_PreviousRun),
    BadInput('export_bad_params', _Lm(
        '--mode=export', f'--model_params_override={_LAYER}.num_heads=3'),
             rf"\(params '{_LAYER}'\): num_heads=3 must divide "
             r'input_dim=128', prepare=_PreviousRun),
    # No layout fits: exit 2, nothing written (no --plan_apply file, no
    # chart), and the line says what the closest layout needs.
    BadInput('plan_nothing_fits', _Lm(
        '--mode=plan', '--plan_cluster=devices=2,tflops=10,memory_gib=0.001,memory_gbps=100',
        '--plan_apply={logdir}/notes/plan.txt'),
             r'^Error: --mode=plan: no layout of lm\.one_billion_wds\.'
             r"OneBWdsGPipeTransformerTiny fits the cluster's memory \(1\.02 "
             r'MiB a device\): the closest, R=\d K=\d v=\d M=\d+ \S+ \S+ '
             r'cut=\S+, needs [\d.]+ MiB on a device\. Lower '
             r'input\.batch_size .*; nothing was written\.$',
             prepare=_PreviousRun),
    # Closed sets, refused whatever the layout (one replica included).
    BadInput('allreduce_typo',
             _Lm('--model_params_override=task.train.allreduce=rign'),
             r"^Error: Bad params: LanguageModel 'lm' \(params 'task'\): "
             r"train\.allreduce='rign' must be one of 'auto', 'ring', 'nccl', "
             r"'hierarchical_copy', 'one_device'\. Did you mean 'ring'\?$",
             prepare=_PreviousRun),
    BadInput('gradient_sync_typo', _Lm(
        '--model_params_override=task.train.gradient_sync=stage_allreduce'),
             r"^Error: Bad params: LanguageModel 'lm' \(params 'task'\): "
             r"train\.gradient_sync='stage_allreduce' must be one of 'auto', "
             r"'none', 'stage_all_reduce', 'sharded_state'\. Did you mean "
             r"'stage_all_reduce'\?$", prepare=_PreviousRun),
    BadInput('shard_optimizer_state_adafactor', _Lm(
        '--model_params_override=task.train.learner.shard_optimizer_state='
        "True;task.train.learner.optimizer.cls=type('cadence.framework."
        "optimizer.Adafactor')"),
             r"\(params 'task\.train\.learner'\): shard_optimizer_state=True "
             r'needs an optimizer that updates each element on its own '
             r'\(SGD, Momentum or Adam\); Adafactor reads whole rows, columns '
             r'or variables, which a shard does not hold\.$'),
    BadInput('shard_optimizer_state_one_device', _Lm(
        '--worker_replicas=2', '--worker_split_size=1',
        '--model_params_override=task.train.learner.'
        "shard_optimizer_state=True;task.train.allreduce='one_device'"),
             r"^Error: Bad params: lm's train: allreduce='one_device' cannot "
             r'gather shards: learner\.shard_optimizer_state gathers the '
             r'updated weights with collectives \(auto, ring or nccl\)\.$'),
    BadInput('allreduce_bytes_per_pack_negative', _Lm(
        '--model_params_override=task.train.allreduce_bytes_per_pack=-1'),
             r"\(params 'task'\): train\.allreduce_bytes_per_pack=-1 must be "
             r'an int >= 0\.$'),
    BadInput('ps_placement_typo', _Lm(
        '--model_params_override=task.train.ps_placement=round-robin'),
             r"\(params 'task'\): train\.ps_placement='round-robin' must be "
             r"one of 'least_loaded', 'round_robin'\. Did you mean "
             r"'round_robin'\?$"),
    BadInput('optimizer_cls_a_string', _Lm(
        "--model_params_override=task.train.learner.optimizer.cls='adam'"),
             r"^Error: Bad params: Learner 'learner' \(params "
             r"'task\.train\.learner'\): optimizer\.cls='adam' must be one of "
             r'SGD, Momentum, Adam, Adafactor \(cadence\.framework\.optimizer\)'
             r"\. Did you mean type\('cadence\.framework\.optimizer\.Adam'\) "
             r'\(a class, not a str\)\?$'),
    BadInput('lr_schedule_cls_an_optimizer', _Lm(
        '--model_params_override=task.train.learner.lr_schedule.cls='
        "type('cadence.framework.optimizer.Adam')"),
             r"\(params 'task\.train\.learner'\): lr_schedule\.cls=<class "
             r"'cadence\.framework\.optimizer\.Adam'> must be one of "
             r'ConstantSchedule, .*\(cadence\.framework\.lr_schedule\)\.$'),
    BadInput('use_nesterov_a_string', [
        f'--model={_IMAGE}', _LOGDIR, '--model_params_override=task.train.'
        "learner.optimizer.use_nesterov='yes'"],
             r"^Error: Bad params: Momentum 'momentum' \(params "
             r"'task\.train\.learner\.optimizer'\): use_nesterov='yes' must be "
             r'True or False\.$'),
    BadInput('params_init_method_case',
             _Lm('--model_params_override=task.params_init.method=Xavier'),
             r"\(params 'task'\): params_init\.method='Xavier' must be one of "
             r"'constant', .*\. Did you mean 'xavier'\?$"),
    BadInput('ln_params_init_method_unknown', _Lm(
        f'--model_params_override={_LAYER}.ln_tpl.params_init.method=ones'),
             rf"^Error: Bad params: LayerNorm 'ln_atten' \(params "
             rf"'{_LAYER}\.ln_tpl'\): params_init\.method='ones' must be one "
             r"of 'constant', "),
    BadInput('is_inference_a_string',
             _Lm("--model_params_override=task.is_inference='False'"),
             r"\(params 'task'\): is_inference='False' must be True or "
             r'False\.$'),
    BadInput('stack_random_seed_a_string',
             _Lm(f"--model_params_override={_STACK}.random_seed='7'"),
             rf"\(params '{_STACK}'\): random_seed='7' must be None or an int "
             r'>= 0\.$'),
    BadInput('stack_fprop_dtype_a_name',
             _Lm(f'--model_params_override={_STACK}.fprop_dtype=bfloat16'),
             rf"\(params '{_STACK}'\): fprop_dtype='bfloat16' must be one of "
             r'.* Did you mean tf\.bfloat16 \(a dtype, not a string\)\?$'),
    BadInput('state_dtype_float16',
             _Lm(f'--model_params_override={_PIPE}.state_dtype=tf.float16'),
             rf"\(params '{_PIPE}'\): state_dtype=tf\.float16 must be one of "
             r'None, tf\.float32, tf\.bfloat16, tf\.float64 \(tf\.float16 is '
             r'not supported: '),
    BadInput('tokenizer_model_type_case',
             _Lm('--model_params_override=input.tokenizer.model_type=BPE'),
             r"^Error: Input: SentencePieceTokenizer 'tokenizer' \(params "
             r"'input\.tokenizer'\): model_type='BPE' must be one of 'bpe', "
             r"'unigram'\. Did you mean 'bpe'\?$", prepare=_PreviousRun),
    BadInput('tokenizer_byte_fallback_a_string',
             _Lm("--model_params_override=input.tokenizer.byte_fallback='no'"),
             r"\(params 'input\.tokenizer'\): byte_fallback='no' must be "
             r'True or False\.$'),
    BadInput('tokenizer_model_file_a_folder',
             _Lm('--model_params_override=input.tokenizer.model_file={logdir}'),
             r"\(params 'input\.tokenizer'\): model_file='.*' does not exist "
             r'or is not a file \(a trained SentencePiece model\)\.$',
             prepare=_PreviousRun),
    BadInput('tokenizer_cls_not_a_tokenizer', _Lm(
        '--model_params_override=input.tokenizer.cls='
        "type('cadence.framework.optimizer.Adam')"),
             r"^Error: Input: LmCorpusInput 'lm_(train|dev)' \(params "
             r"'input'\): tokenizer\.cls=<class 'cadence\.framework\.optimizer"
             r"\.Adam'> must be a tokenizers\.BaseTokenizer"),
    BadInput('resnet_schedule_case', [
        f'--model={_IMAGE}', _LOGDIR,
        '--model_params_override=task.resnet_tpl.pipeline_tpl.schedule=GPipe'],
             r"^Error: Bad params: PipeliningLayer \(params "
             r"'task\.resnet_tpl\.pipeline_tpl'\): schedule='GPipe' must be "
             r"one of 'gpipe', .*\. Did you mean 'gpipe'\?$",
             prepare=_PreviousRun, real=True),
    BadInput('resnet_bn_dtype_a_name', [
        f'--model={_IMAGE}', _LOGDIR,
        "--model_params_override=task.resnet_tpl.bn_tpl.dtype='float32'"],
             r"^Error: Bad params: BatchNormLayer \(params "
             r"'task\.resnet_tpl\.bn_tpl'\): dtype='float32' must be one of "
             r'tf\.float32, tf\.float64\. Did you mean tf\.float32 \(a dtype, '
             r'not a string\)\?$'),
    BadInput('regression_activation_typo', [
        f'--model={_REGRESSION}', _LOGDIR,
        '--model_params_override=task.activation=RELUU'],
             r"^Error: Bad params: RegressionModel 'regression' \(params "
             r"'task'\): activation='RELUU' is invalid: .*Did you mean "
             r"'RELU'\?$"),
    BadInput('regression_pipeline_tpl_a_string', [
        f'--model={_REGRESSION}', _LOGDIR,
        '--model_params_override=task.pipeline_tpl=gpipe'],
             r"\(params 'task'\): pipeline_tpl='gpipe' must be None \(a "
             r'FeedForwardNet\) or a gpipe\.PipeliningLayer\.Params\(\)\.$'),
    # Experiments of a user's own (tests/bad_units.py, by their dotted
    # paths): a pipeline of one's own units, the unit whose FPropMeta
    # breaks the contract named by its params path (not the layer after
    # it), and the stack's own knobs.
    BadInput('unit_meta_plain_number', _Own('PlainNumberMlp'),
             rf"^Error: Bad params: PlainNumber \(params '{_UNITS}\[1\]'\): "
             r'FPropMeta returned 1024 \(an int\); FPropMeta\(params, '
             r'\*input_shapes\) must return a cost record, cost\.Cost\('
             r'out_shapes=\(\.\.\.\), flops=\.\.\.\) \(framework/cost\.py\)\.$',
             real=True),
    BadInput('unit_meta_plain_number_inspect',
             _Own('PlainNumberMlp', '--mode=inspect_model'),
             rf"^Error: Bad params: PlainNumber \(params '{_UNITS}\[1\]'\): "
             r'FPropMeta returned 1024 \(an int\); FPropMeta\(params, '),
    BadInput('unit_meta_wrong_shape', _Own('WrongShapeMlp'),
             rf"^Error: Bad params: WrongShape \(params '{_UNITS}\[1\]'\): "
             r'FPropMeta states output shape\(s\) \[1, 16\] but FProp gives '
             r'\[1, 8\] on input\(s\) \[1, 8\]; FPropMeta\'s out_shapes must '
             r"be FProp's"),
    # The same unit put in by an override of the README's experiment.
    BadInput('unit_meta_wrong_shape_override', [
        f'--model={_PIPELINED_MLP}', _LOGDIR,
        f"--model_params_override={_UNITS}[1].cls="
        "type('cadence.tests.bad_units.WrongShape')"],
             rf"^Error: Bad params: WrongShape \(params '{_UNITS}\[1\]'\): "
             r'FPropMeta states output shape\(s\) \[1, 16\]'),
    BadInput('stack_example_shape_rank', _Own('ExampleRankMlp'),
             r"^Error: Bad params: GPipeStack 'net': task\.net_tpl\."
             r'example_shape=\[8, 1\] must be one example of the inputs '
             r'\[batch, \.\.\.\]: \[8\] \(the inputs are \[32, 8\]\)\.$'),
    BadInput('stack_unit_is_a_class', _Own('LayerClassMlp'),
             rf"^Error: Bad params: GPipeStack 'net': {_UNITS}\[2\]=<class "
             r"'cadence\.params\.examples\.pipelined_mlp\.ResidualMlp'> is a "
             r'layer class, not its params: pass ResidualMlp\.Params\(\) '),
    # Devices: --xla and the TPU.
    BadInput('xla_over_two_devices', _Lm('--xla', '--worker_split_size=2'),
             r"^Error: Bad params: lm's train: --xla compiles one replica's "
             r'step as one XLA program on one device, but a replica spans 2 '
             r'devices'),
    BadInput('xla_dynamic_shapes', [
        f'--model={_REGRESSION}', _LOGDIR, '--job=trainer', '--xla',
        '--model_params_override=input.fixed_input_shape=False'],
             r"^Error: The input of task 'regression': input batch field 'x' "
             r'has shape \[\?, 8\]: dimension 0 is not fixed; TPU and --xla '
             r'need fully defined batch shapes: set fixed_input_shape=True'),
    BadInput('tpu_with_replicas', _Lm('--tpu=my-tpu', '--worker_replicas=2'),
             r"^Error: --tpu='my-tpu' with --worker_replicas=2: on a TPU the "
             r'replicas are its cores / --worker_split_size; leave '
             r'--worker_replicas at 1\.$'),
    # The README's TPU command by name, without a TPU: one line saying what
    # a TPU name needs (without the tpu extra), or that it could not be
    # resolved (with it: no credentials here, nor a GCE metadata probe).
    BadInput('readme_tpu_command', _Lm(
        '--job=trainer', '--tpu=my-tpu', '--tpu_zone=us-central1-b',
        '--tpu_project=my-project', '--worker_split_size=2'),
             r"^Error: --tpu='my-tpu' --tpu_zone='us-central1-b' "
             r"--tpu_project='my-project': (a TPU name is looked up with the "
             r'Cloud TPU API, whose client is not installed: pip install -e '
             r'"\.\[tpu\]" \(in one command with your TensorFlow extra, '
             r'e\.g\. "\.\[cpu,tpu\]"\); or give --tpu=local on a TPU VM, or '
             r"a TPU Node's grpc://host:8470 address\.$|cannot resolve the "
             r'TPU \(DefaultCredentialsError: )',
             env={'NO_GCE_CHECK': 'True', 'GOOGLE_APPLICATION_CREDENTIALS': '',
                  'CLOUDSDK_CONFIG': '/nonexistent/gcloud'},
             real=True),
]


class BadInputsTest(tf.test.TestCase):

  def testEveryBadInputExitsTwoWithOneLineAndTouchesNothing(self):
    self.addCleanup(lambda: [p.kill() for p in _HOLDERS])
    self.assertGreaterEqual(len(_BEFORE_TF) + len(_MODEL), 30)
    # An unreachable TPU address: it must fail at once (gRPC would retry
    # for minutes), and last (connecting changes the process).
    port = test_utils.FreePorts(1)[0]
    model = _MODEL + [BadInput(
        'tpu_unreachable', _Lm('--job=trainer',
                               f'--tpu=grpc://127.0.0.1:{port}'),
        rf"^Error: --tpu='grpc://127\.0\.0\.1:{port}': cannot connect to or "
        rf'initialise the TPU at grpc://127\.0\.0\.1:{port} '
        r'\(UnavailableError: ')]
    user = test_utils.WriteFiles(os.path.join(self.get_temp_dir(), 'user'),
                                 _USER_FILES)
    results = test_utils.RunBadInputs(
        self, {'before_tf': _BEFORE_TF, 'model': model},
        self.get_temp_dir(), timeout=300, env={'PYTHONPATH': os.pathsep.join(
            filter(None, [user, os.environ.get('PYTHONPATH')]))})
    for row, (_, _, tf_imported) in zip(_BEFORE_TF, results['before_tf']):
      with self.subTest(row=row.name):   # Answered without TensorFlow.
        self.assertFalse(tf_imported)


if __name__ == '__main__':
  tf.test.main()
