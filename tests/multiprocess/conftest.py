"""Multi-process tests: each test starts its own JAX processes (launcher.py) on this host.

Nothing here touches JAX devices in the pytest process. The runtime's multi-process part is in
every build: a test marked ``needs_world`` runs always, and fails when that part is broken.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "needs_world: runs collectives across processes in the jax_rccl runtime"
    )
