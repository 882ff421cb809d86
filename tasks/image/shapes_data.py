"""An embedded image data set: ten kinds of drawn shapes, made from a seed.

Each example is one filled or outlined shape (`CLASSES`), turned a little,
on a shaded background with pixel noise, in colours, at a random centre
and size.
Example i depends only on (seed, i): a numpy Generator seeded with
[seed, i] draws its centre, size, colours and noise, so data sets drawn
with different seeds (train, dev, test) are independent and every run
sees the same images. Nothing is downloaded; 10,000 32x32 images take
about a second.

Example:
  images, labels = DrawShapes(16, [32, 32], seed=1)
  # images: uint8 [16, 32, 32, 3]; labels: int32 [16] in [0, 10)
"""
import numpy as np

CLASSES = ('circle', 'ring', 'square', 'frame', 'diamond', 'triangle',
           'plus', 'cross', 'hbar', 'vbar')


def _Mask(kind, dx, dy):
  """Bool [h, w]: where shape `kind` covers the plane.

  Args:
    kind: a name of CLASSES.
    dx, dy: [h, w] pixel offsets from the centre, in units of the radius
      (dy grows downwards).
  """
  ax, ay = np.abs(dx), np.abs(dy)
  box = np.maximum(ax, ay)
  if kind == 'circle':
    return dx**2 + dy**2 <= 1.0
  if kind == 'ring':
    return (dx**2 + dy**2 <= 1.0) & (dx**2 + dy**2 >= 0.45)
  if kind == 'square':
    return box <= 0.8
  if kind == 'frame':
    return (box <= 0.85) & (box >= 0.5)
  if kind == 'diamond':
    return ax + ay <= 1.0
  if kind == 'triangle':     # apex up
    return (dy <= 0.8) & (ax <= (dy + 1.0) * 0.55)
  if kind == 'plus':
    return ((ax <= 0.3) | (ay <= 0.3)) & (box <= 1.0)
  if kind == 'cross':
    return (np.abs(ax - ay) <= 0.35) & (box <= 0.9)
  if kind == 'hbar':
    return (ay <= 0.3) & (ax <= 1.0)
  if kind == 'vbar':
    return (ax <= 0.3) & (ay <= 1.0)
  raise ValueError(f'unknown shape {kind!r}; expected one of {CLASSES}.')


def DrawExample(index, image_size, seed, noise_stddev=0.12):
  """Example `index` of the data set of `seed`.

  The shape is turned by up to 25 degrees either way (less than the 45
  that would make a square a diamond, or a plus a cross), the background
  is a linear ramp of random direction, and Gaussian noise is added.

  Returns:
    (image uint8 [h, w, 3], label int in [0, len(CLASSES))).
  """
  rng = np.random.default_rng([seed, index])
  h, w = image_size
  label = int(rng.integers(len(CLASSES)))
  radius = rng.uniform(0.18, 0.4) * min(h, w)
  cy = rng.uniform(radius, h - radius)
  cx = rng.uniform(radius, w - radius)
  angle = np.deg2rad(rng.uniform(-25.0, 25.0))
  ys, xs = np.mgrid[0:h, 0:w].astype(np.float32) + 0.5
  dx, dy = (xs - cx) / radius, (ys - cy) / radius
  cos, sin = np.cos(angle), np.sin(angle)
  mask = _Mask(CLASSES[label], cos * dx + sin * dy, cos * dy - sin * dx)
  background = rng.uniform(0.0, 0.4, size=3)
  foreground = rng.uniform(0.6, 1.0, size=3)
  if rng.random() < 0.5:    # Dark on light as often as light on dark.
    background, foreground = 1.0 - background, 1.0 - foreground
  ramp_angle = rng.uniform(0.0, 2 * np.pi)
  ramp = 0.15 * (np.cos(ramp_angle) * (xs / w - 0.5) +
                 np.sin(ramp_angle) * (ys / h - 0.5))
  image = np.where(mask[..., None], foreground, background) + ramp[..., None]
  image = image + rng.normal(0.0, noise_stddev, size=image.shape)
  return (np.clip(image * 255.0 + 0.5, 0, 255).astype(np.uint8), label)


def DrawShapes(num_examples, image_size, seed, first_example=0):
  """Examples [first_example, first_example + num_examples) of `seed`.

  Returns:
    (images uint8 [n, h, w, 3], labels int32 [n]).
  """
  h, w = image_size
  images = np.empty([num_examples, h, w, 3], np.uint8)
  labels = np.empty([num_examples], np.int32)
  for j in range(num_examples):
    images[j], labels[j] = DrawExample(first_example + j, image_size, seed)
  return images, labels
