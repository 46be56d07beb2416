"""The on-device floor stands on its own: hmt.runtime and hmt.serve import no offline stage, and
deploy's verify runs graphs through hmt.runtime, not serve."""

from __future__ import annotations

import subprocess
import sys
import textwrap

OFFLINE = ("hmt.supernet", "hmt.profile", "hmt.pareto", "hmt.convert", "hmt.fuse", "hmt.deploy", "hmt.data",
           "torch", "typer", "rich", "onnx")

CODE = textwrap.dedent(
    """
    import importlib, pkgutil, sys

    BLOCKED = {blocked!r}

    class Block:
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                raise ImportError(f"blocked import of {{name}}")
            return None

    sys.meta_path.insert(0, Block())
    import hmt.runtime, hmt.serve
    for package in (hmt.runtime, hmt.serve):
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            importlib.import_module(info.name)
    print("ok")
    """
)


def test_runtime_and_serve_import_no_offline_stage() -> None:
    done = subprocess.run([sys.executable, "-c", CODE.format(blocked=OFFLINE)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"


def test_deploy_verify_does_not_load_graphs_through_serve() -> None:
    import ast
    from pathlib import Path

    import hmt.deploy

    for path in Path(hmt.deploy.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hmt.serve"):
                assert node.module == "hmt.serve.settings", f"{path.name} imports {node.module}"
