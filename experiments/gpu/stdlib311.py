"""pe-bench with data=stdlib read from /tmp/py311: the CPU runs' Python 3.11 standard library
(corpus sha c17d741c64d6), so the GPU's records score the same text as the committed CPU ones."""

import sys
import sysconfig

_paths = sysconfig.get_paths
sysconfig.get_paths = lambda *a, **k: {**_paths(*a, **k), "stdlib": "/tmp/py311"}
from pe_bench.cli.bench import main  # noqa: E402

sys.exit(main())
