"""The C++ layers (cmake/layers.cmake): every #include of the tree stays within the layers its
folder may use, and an include that crosses a layer the wrong way fails the check."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CMAKE = shutil.which("cmake")

pytestmark = pytest.mark.skipif(CMAKE is None, reason="needs cmake")


def check(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CMAKE, f"-DROOT={root}", "-P", str(ROOT / "cmake" / "layers.cmake")],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_tree_keeps_its_layers():
    r = check(ROOT)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(
    "source, include",
    [
        ("ffi/planner/plan.cc", "ffi/cpu/comm.h"),  # the planner knows no runtime
        ("ffi/core/status.cc", "ffi/planner/types.h"),  # core is the bottom layer
        ("ffi/cpu/comm.cc", "ffi/handlers/collective.h"),  # the communicator knows no handler
        ("ffi/comm/shm.cc", "ffi/host/transport_host.h"),  # the shared layer knows no executor
        ("ffi/comm/proxy.cc", "ffi/cpu/net_links.h"),  # nor the CPU runtime above it
        ("ffi/gpu/comm.cc", "ffi/host/executor.h"),  # the GPU runtime knows no host executor
        ("ffi/host/executor.cc", "hip/portability.h"),  # the host executor knows no device code
        ("hip/runtime.hip", "ffi/comm/shm.h"),  # device code knows no transport
    ],
)
def test_an_include_across_a_layer_fails(tmp_path, source, include):
    for folder in ("ffi", "hip"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    path = tmp_path / source
    path.write_text(f'#include "{include}"\n' + path.read_text())
    r = check(tmp_path)
    assert r.returncode != 0
    assert f'{source} includes "{include}"' in r.stderr.replace("\n  ", " ")
    layer = str(Path(source).parent) if not source.startswith("hip/") else "hip"
    assert f"the layer {layer} may include only" in r.stderr.replace("\n  ", " ")
