import pytest


def pytest_collection_modifyitems(config, items):
    """GPU tests run only where a GPU backend is present."""
    try:
        import jax

        has_gpu = any(d.platform in ("gpu", "cuda", "rocm") for d in jax.devices())
    except Exception:  # noqa: BLE001 - no backend means no GPU
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
