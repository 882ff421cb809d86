"""Tests of tasks/lm/cache_files.py's CacheDir: under $XDG_CACHE_HOME when set.

CacheDir reads the environment it is given; the LM's default cache paths
(the Tiny LM's corpus, DATA_DIR; the SentencePiece models; the tokenised
files) are read in a subprocess started with XDG_CACHE_HOME set, as a
trainer started so sees them. (The digests are tested with the caches that
keep them: tokenizers_test.py, token_cache_test.py, synthetic_corpus_test.py.)
"""
import json
import os
import tempfile
import unittest

from cadence.tasks.lm import cache_files
from cadence.tests import test_utils

_SCRIPT = """
import json
from cadence.framework import model_registry
from cadence.tasks.lm import token_cache
from cadence.tasks.lm import tokenizers
params = model_registry.GetParams(
    'lm.one_billion_wds.OneBWdsGPipeTransformerTiny', 'Train')
print(json.dumps(dict(data_dir=params.input.data_dir,
                      spm=tokenizers.DefaultCacheDir(),
                      tokens=token_cache.DefaultDir())))
"""


class CacheDirTest(unittest.TestCase):

  def testXdgCacheHomeWhenAbsoluteElseTheHomesCache(self):
    home = '/home/u'
    for env, root in (
        ({'XDG_CACHE_HOME': '/xdg', 'HOME': home}, '/xdg/cadence'),
        ({'HOME': home}, '/home/u/.cache/cadence'),
        # Empty or relative: the XDG specification says to ignore it.
        ({'XDG_CACHE_HOME': '', 'HOME': home}, '/home/u/.cache/cadence'),
        ({'XDG_CACHE_HOME': 'cache', 'HOME': home},
         '/home/u/.cache/cadence')):
      with self.subTest(**env):
        self.assertEqual(root, cache_files.CacheDir(environ=env))
        self.assertEqual(f'{root}/spm',
                         cache_files.CacheDir('spm', environ=env))

  def testTheLmsCachesFollowXdgCacheHomeInANewProcess(self):
    tmp = tempfile.mkdtemp()
    xdg, home = os.path.join(tmp, 'xdg'), os.path.join(tmp, 'home')
    env = dict(test_utils.QUIET_ENV, XDG_CACHE_HOME=xdg, HOME=home)
    out = test_utils.RunPython(_SCRIPT, env=env).stdout
    self.assertEqual(dict(data_dir=f'{xdg}/cadence/synthetic_lm',
                          spm=f'{xdg}/cadence/spm',
                          tokens=f'{xdg}/cadence/tokens'),
                     json.loads(out.strip().splitlines()[-1]))
    self.assertFalse(os.path.exists(os.path.join(home, '.cache')))


if __name__ == '__main__':
  unittest.main()
