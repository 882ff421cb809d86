"""The cut of a sequence into contiguous parts of near-equal cost.

`BalancedPartition` is the pure partitioner the pipeline's cut into stages
rests on: layers/gpipe_partition.py (a model's layers or units, by FLOPs or
measured time) and the planner (framework/planning/planner.py, by predicted
stage times) both call it. It knows nothing of layers or devices.

Example:
  BalancedPartition([4, 1, 1, 2, 2], 2)   # [0, 2, 5]: parts 5 and 5
"""


def BalancedPartition(costs, num_parts):
  """Optimal contiguous partition of `costs` into `num_parts` parts.

  Minimises the largest part's sum (dynamic programming, O(P * L^2)); every
  part is non-empty.

  Args:
    costs: list of L non-negative numbers.
    num_parts: P, 1 <= P <= L.

  Returns:
    P + 1 boundaries [0, b_1, ..., L]: part i is costs[b_i:b_{i+1}].
  """
  n = len(costs)
  if not 1 <= num_parts <= n:
    raise ValueError(f'BalancedPartition: num_parts={num_parts} must be in '
                     f'[1, {n}] (the number of items).')
  prefix = [0]
  for c in costs:
    prefix.append(prefix[-1] + c)
  inf = float('inf')
  # best[k][j]: min max-part of costs[:j] in k parts; cut[k][j]: last start.
  best = [[inf] * (n + 1) for _ in range(num_parts + 1)]
  cut = [[0] * (n + 1) for _ in range(num_parts + 1)]
  best[0][0] = 0
  for k in range(1, num_parts + 1):
    for j in range(k, n - (num_parts - k) + 1):
      for s in range(k - 1, j):
        v = max(best[k - 1][s], prefix[j] - prefix[s])
        if v < best[k][j]:
          best[k][j], cut[k][j] = v, s
  bounds = [n]
  for k in range(num_parts, 0, -1):
    bounds.append(cut[k][bounds[-1]])
  return bounds[::-1]
