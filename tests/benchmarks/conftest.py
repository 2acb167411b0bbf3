"""The benchmark scripts (benchmarks/*.py) as modules, for tests of their pure parts."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from types import ModuleType

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(ROOT, "benchmarks", f"{name}.py")
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def bench_script() -> Callable[[str], ModuleType]:
    """bench_script("gpu_trace"): benchmarks/gpu_trace.py, loaded fresh."""
    return _load
