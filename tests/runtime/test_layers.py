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
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            importlib.import_module(info.name)
    print("ok")
    """
)


def test_runtime_and_serve_import_no_offline_stage() -> None:
    done = subprocess.run([sys.executable, "-c", CODE.format(blocked=OFFLINE)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"


def test_deploy_does_not_import_serve() -> None:
    """deploy loads graphs through hmt.runtime and writes serve.json with hmt.runtime.settings."""
    for path, names in _imports("deploy").items():
        assert not [n for n in names if n.startswith("hmt.serve")], path


def _imports(package_dir: str) -> dict[str, set[str]]:
    """Every hmt module each file of ``package_dir`` imports (top level or inside functions)."""
    import ast
    from pathlib import Path

    import hmt

    root = Path(hmt.__file__).parent / package_dir
    found: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
        found[str(path.relative_to(root.parent))] = {n for n in names if n.startswith("hmt.")}
    return found


def test_no_import_cycle_between_convert_and_fuse() -> None:
    """The graph-pass catalogue both share sits below them, in hmt.graph."""
    for path, names in _imports("graph").items():
        assert not [n for n in names if n.startswith(("hmt.convert", "hmt.fuse"))], path
    for path, names in _imports("convert").items():
        assert not [n for n in names if n.startswith("hmt.fuse")], path


def test_profile_stages_do_not_import_the_run_that_orders_them() -> None:
    stages = _imports("profile")["profile/stages.py"]
    assert "hmt.profile.run" not in stages
