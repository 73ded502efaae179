"""The config reference documents every Global key the schema accepts."""

import os

from ppdist.config import GLOBAL_SCHEMA, UNSUPPORTED_GLOBAL


def test_every_global_key_is_documented(repo_root):
    with open(os.path.join(repo_root, "docs", "config_reference.md"), encoding="utf-8") as handle:
        text = handle.read()
    missing = [k for k in list(GLOBAL_SCHEMA) + list(UNSUPPORTED_GLOBAL) if f"`{k}`" not in text]
    assert not missing, missing
