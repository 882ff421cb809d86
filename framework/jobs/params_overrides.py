"""The two override flags' text, read and checked before TensorFlow loads.

`--model_params_override` is Params text ('key : value' lines, as in
params.txt) or ';'-separated key=value items (`ParseOverride`);
`--model_params_file_override` names a file of Params text, which must be
UTF-8 (`ParamsFileText`). The trainer's checks (trainer_options.py) call
these on the flags' values; run_params.py applies them to the params with
the same functions, so both read the text alike. No TensorFlow.

Example:
  ParseOverride('task.input_dim=4;input.batch_size=8')
  # [('task.input_dim', '4'), ('input.batch_size', '8')]
  ParseOverride('task.input_dim : 4')   # None: Params text.
"""
import os

from cadence.framework.jobs import user_error

UserError = user_error.UserError


def ParseOverride(text):
  """`--model_params_override` as a list of (key, value text) pairs, or None.

  Returns None for Params text ('key : value' lines, as in params.txt), and
  the pairs of ';'-separated 'key=value' items otherwise.

  Raises:
    UserError: an item that is not 'key=value'.
  """
  if ' : ' in text or '\n' in text:
    return None
  pairs = []
  for item in [s.strip() for s in text.split(';') if s.strip()]:
    key, sep, value = item.partition('=')
    if not sep or not key.strip():
      raise UserError(f"--model_params_override: {item!r} is not "
                      "'key=value' (items are separated by ';').")
    pairs.append((key.strip(), value.strip()))
  return pairs


def ParamsFileText(path, data):
  """The text of the --model_params_file_override `path`, from its bytes.

  Raises:
    UserError: the bytes are not UTF-8 text (e.g. a binary file).
  """
  try:
    return data.decode('utf-8')
  except UnicodeDecodeError as e:
    raise UserError(f'--model_params_file_override={path!r} is not UTF-8 '
                    f'text (byte {e.start}: {e.reason}); it must hold '
                    "Params text, 'key : value' lines as in params.txt."
                    ) from None


def CheckOverride(name, text):
  """The check of --model_params_override (`name`): its items parse."""
  del name
  if text:
    ParseOverride(text)


def CheckParamsFile(name, path):
  """The check of --model_params_file_override (`name`): a local file must
  be a readable UTF-8 text file (a remote one is read, and checked, with
  the params)."""
  if not path or not user_error.IsLocal(path):
    return
  flag = f'--{name}={path!r}'
  if not os.path.exists(path):
    raise UserError(f'{flag}: no such file.')
  if not os.path.isfile(path):
    raise UserError(f'{flag} is not a file (a Params text file, '
                    "'key : value' lines as in params.txt).")
  try:
    with open(path, 'rb') as f:
      ParamsFileText(path, f.read())
  except OSError as e:
    raise UserError(f'{flag}: cannot read it: {e.strerror or e}.') from None
