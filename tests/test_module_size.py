"""Small modules with one job: no module of the package is over ``MAX_LINES`` lines."""

from __future__ import annotations

import os

from test_import_graph import module_files

MAX_LINES = 500


def test_no_module_is_over_500_lines():
    sizes = {}
    for module, path in module_files().items():
        with open(path, encoding="utf-8") as handle:
            sizes[module] = sum(1 for _ in handle)
    over = {m: n for m, n in sorted(sizes.items()) if n > MAX_LINES}
    assert not over, f"split these modules by their jobs (at most {MAX_LINES} lines each): {over}"
    assert len(sizes) > 100 and all(os.path.sep not in m for m in sizes)
