"""The store's views (schemas/views.py) are the Lake's own: any query reads them, with no import to make first."""

from __future__ import annotations

import subprocess
import sys

from trajlake.schemas.views import VIEWS


def test_views_exist_with_only_the_store_imported(tmp_path):
    """A fresh process that imports only trajlake.store reads every view (empty on a new lake)."""
    code = ("import sys\nfrom trajlake.store import Lake\nwith Lake.open(sys.argv[1]) as lake:\n"
            "    for name in sys.argv[2:]:\n"
            "        print(name, lake.query(f'SELECT count(*) AS n FROM {name}')['n'][0])\n"
            "assert 'trajlake.rewards' not in sys.modules, 'the store imported rewards'\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "lake"), *VIEWS], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:-1] == [f"{name} 0" for name in VIEWS]
