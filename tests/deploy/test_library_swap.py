"""A loaded TVM library runs from a private copy: what was hashed is what runs, and overwriting the
bundle's .so while serving neither crashes the process (SIGBUS) nor changes what runs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hmt.runtime.tvm import tvm_available

REPO = Path(__file__).resolve().parents[2]

_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from hmt.bundle import load_bundle
    from hmt.errors import ArtifactError
    from hmt.runtime.variant import graph_fn

    bundle = load_bundle(sys.argv[1])
    variant = next(v for v in bundle.spec.variants if "tvm" in v.engines)
    graph = variant.segments[0]
    x = np.random.default_rng(0).standard_normal(graph.input.shape).astype(np.float32)
    fn = graph_fn(bundle, graph, "tvm", threads=1)
    before = fn(x)
    library = bundle.root / graph.tvm
    size = library.stat().st_size
    with open(library, "r+b") as handle:  # in place, same inode: what cp over a file does
        handle.write(bytes(size))
    after = fn(x)  # a mapping of the bundle's file would fault here
    assert np.array_equal(before, after)
    try:
        graph_fn(bundle, graph, "tvm", threads=1)
    except ArtifactError as exc:
        assert "changed after the artifact was built" in str(exc), exc
    else:
        raise AssertionError("a changed library was loaded")
    print("OK")
""")


@pytest.mark.skipif(not tvm_available(), reason="the TVM runtime is not installed")
def test_overwriting_a_loaded_library_neither_crashes_nor_changes_what_runs(bundle_copy: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", _SCRIPT, str(bundle_copy)], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0 and "OK" in done.stdout, (done.returncode, done.stderr[-2000:])
