"""The docs' build hook and its page generators live in docs/hooks/ (MkDocs loads them by
path); the tests import them the same way, from that folder."""

from __future__ import annotations

import sys

from tests.conftest import REPO

HOOKS = REPO / "docs" / "hooks"
if str(HOOKS) not in sys.path:
    sys.path.insert(0, str(HOOKS))
