"""NestedMap: a dict with attribute access, the currency of layer inputs.

Layers pass structured values (`theta`, states, inputs) as NestedMaps. It is
a plain `dict` subclass, so `tf.nest`, `tf.function` signatures and
`tf.while_loop` loop variables accept it as they accept a dict.

Example:
  m = NestedMap(x=tf.ones([2, 3]), sub=NestedMap(y=1))
  m.sub.y            # 1
  m.Flatten()        # [<tf.Tensor ...>, 1]   (sorted-key order)
  m.Transform(lambda v: v * 2)
"""
import difflib
import re

import tensorflow as tf

_KEY_RE = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*$')
# dict attributes a key may not shadow, or attribute access would break.
_RESERVED_KEYS = frozenset(dir(dict))


def _CheckKey(key):
  if not isinstance(key, str) or not _KEY_RE.match(key):
    raise ValueError(
        f'NestedMap key {key!r} is not a valid identifier (letters, digits '
        'and underscores, not starting with a digit).')
  if key in _RESERVED_KEYS:
    raise ValueError(
        f'NestedMap key {key!r} shadows a dict attribute; pick another name.')


def _IsLeafContainer(v):
  # A tuple type may declare its instances values (shapes.Shape does).
  return (isinstance(v, (NestedMap, list, tuple)) and not _IsNamedTuple(v)
          and not getattr(v, 'IS_NESTED_MAP_LEAF', False))


def _IsNamedTuple(v):
  return isinstance(v, tuple) and hasattr(v, '_fields')


class NestedMap(dict):
  """A dict whose keys are identifiers, readable as attributes.

  Nesting is through NestedMap, list and tuple values; anything else is a
  leaf. Plain dict values are leaves for `Flatten` (use NestedMap to nest).
  """

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    for key in self:
      _CheckKey(key)

  def __setitem__(self, key, value):
    _CheckKey(key)
    super().__setitem__(key, value)

  def __setattr__(self, name, value):
    self[name] = value

  def __getattr__(self, name):
    try:
      return self[name]
    except KeyError:
      close = difflib.get_close_matches(name, list(self.keys()), n=3)
      hint = f' Did you mean {", ".join(map(repr, close))}?' if close else ''
      raise AttributeError(
          f'NestedMap has no key {name!r}; keys are {sorted(self.keys())}.'
          f'{hint}') from None

  def __delattr__(self, name):
    try:
      del self[name]
    except KeyError:
      raise AttributeError(f'NestedMap has no key {name!r}.') from None

  def copy(self):
    """Shallow copy that stays a NestedMap."""
    return NestedMap(self)

  def DeepCopy(self):
    """Copies every nested NestedMap/list/tuple; leaves are shared."""
    return self.Pack(self.Flatten())

  # --- flattening -------------------------------------------------------

  def FlattenItems(self):
    """Returns [(dotted_key, leaf)] in sorted-key, depth-first order.

    List elements appear as `key[i]`, e.g. `('layers[1].w', leaf)`.
    """
    out = []

    def _Walk(prefix, v):
      if isinstance(v, NestedMap):
        for k in sorted(v):
          _Walk(f'{prefix}.{k}' if prefix else k, v[k])
      elif _IsLeafContainer(v):
        for i, x in enumerate(v):
          _Walk(f'{prefix}[{i}]', x)
      else:
        out.append((prefix, v))

    _Walk('', self)
    return out

  def Flatten(self):
    """Returns the leaves in the order of `FlattenItems`."""
    return [v for _, v in self.FlattenItems()]

  def Pack(self, leaves):
    """Returns a NestedMap of this structure holding `leaves` in order.

    Args:
      leaves: a sequence with one value per leaf of `self`, in `Flatten`
        order.

    Raises:
      ValueError: if the number of leaves does not match.
    """
    leaves = list(leaves)
    want = len(self.FlattenItems())
    if len(leaves) != want:
      raise ValueError(
          f'NestedMap.Pack: structure has {want} leaves, got {len(leaves)}.')
    it = iter(leaves)

    def _Build(v):
      if isinstance(v, NestedMap):
        return NestedMap({k: _Build(v[k]) for k in sorted(v)})
      if _IsLeafContainer(v):
        return type(v)(_Build(x) for x in v)
      return next(it)

    return _Build(self)

  def Transform(self, fn):
    """Returns a NestedMap of the same structure with `fn(leaf)` leaves."""
    return self.Pack([fn(v) for v in self.Flatten()])

  def Filter(self, fn):
    """Returns a NestedMap keeping the leaves where `fn(leaf)` is true.

    Containers left empty by the filter are dropped.
    """

    def _Keep(v):
      if isinstance(v, NestedMap):
        kept = NestedMap()
        for k in sorted(v):
          sub = _Keep(v[k])
          if sub is not _DROP:
            kept[k] = sub
        return kept if kept else _DROP
      if _IsLeafContainer(v):
        kept = [s for s in (_Keep(x) for x in v) if s is not _DROP]
        return type(v)(kept) if kept else _DROP
      return v if fn(v) else _DROP

    result = _Keep(self)
    return NestedMap() if result is _DROP else result

  def IsCompatible(self, other):
    """True if `other` is a NestedMap with the same keys and nesting."""
    if not isinstance(other, NestedMap):
      return False
    try:
      tf.nest.assert_same_structure(self, other, check_types=False)
    except (ValueError, TypeError):
      return False
    mine = [k for k, _ in self.FlattenItems()]
    theirs = [k for k, _ in other.FlattenItems()]
    return mine == theirs

  def DebugString(self):
    """One `dotted.key  value` line per leaf, sorted; tensors by shape."""
    lines = []
    for key, v in self.FlattenItems():
      if isinstance(v, (tf.Tensor, tf.Variable)):
        v = f'{v.dtype.name}{v.shape.as_list()}'
      lines.append(f'{key:<40} {v}')
    return '\n'.join(lines)


_DROP = object()
