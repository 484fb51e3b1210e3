"""Without verl, ``import oblr.integrations.verl`` fails with one line naming the extra to install."""

from __future__ import annotations

import importlib.util
import sys

import pytest


@pytest.mark.skipif(importlib.util.find_spec("verl") is not None, reason="verl is installed here")
def test_import_without_verl_names_the_extra(monkeypatch):
    for name in [m for m in sys.modules if m.startswith("oblr.integrations.verl")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ModuleNotFoundError, match=r'^oblr.integrations.verl needs verl: pip install "oblr\[verl\]"$'):
        import oblr.integrations.verl  # noqa: F401
