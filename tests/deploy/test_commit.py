"""deploy commits the bundle directory and OUT.tar.gz together: a kill never leaves a stale archive "OK".

The kill is real: a deploy in a subprocess SIGKILLs itself right after the directory swap
(the moment at which the old deploy had a new directory beside the previous archive).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

import commands.deploy  # noqa: F401 - registers the command
from commands.app import app
from hmt.artifacts import load_artifact
from hmt.deploy import DeployOptions, deploy_bundle, verify_bundle
from hmt.deploy.archive import archive_path_for
from hmt.errors import ArtifactError

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()

_KILLED_DEPLOY = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from hmt.deploy import DeployOptions, deploy_bundle
    fused, pareto, out = sys.argv[1:4]
    out_abs = os.path.abspath(out)
    real_replace = os.replace

    def replace_then_die(src, dst):
        real_replace(src, dst)
        if os.fspath(dst) == out_abs and os.fspath(src).endswith(".partial"):
            os.kill(os.getpid(), signal.SIGKILL)  # the new directory is in place, nothing after it ran

    os.replace = replace_then_die
    deploy_bundle(fused, pareto, out, options=DeployOptions(target="x86-64", engines=("onnxruntime",),
                                                            latency_ms=9.0))
""")


def _deploy(fused: Path, pareto: Path, out: Path, latency_ms: float) -> None:
    deploy_bundle(fused, pareto, out, options=DeployOptions(target="x86-64", engines=("onnxruntime",),
                                                           latency_ms=latency_ms))


def test_a_kill_between_swap_and_archive_leaves_no_stale_archive(fused_dir: Path, pareto_dir: Path,
                                                                  tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    archive = archive_path_for(out)
    _deploy(fused_dir, pareto_dir, out, latency_ms=5.0)
    before = load_artifact(out, kind="bundle").manifest_sha256
    verify_bundle(archive, run_models=False)  # the first build's pair is fine

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", _KILLED_DEPLOY, str(fused_dir), str(pareto_dir), str(out)],
                          env=env, capture_output=True, timeout=300, check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    assert load_artifact(out, kind="bundle").manifest_sha256 != before  # the new directory is in place
    # The previous build's archive is gone, not left beside the new directory.
    assert not archive.exists()
    result = runner.invoke(app, ["deploy", "--verify", str(archive)])
    assert result.exit_code != 0 and "bundle OK" not in result.output

    _deploy(fused_dir, pareto_dir, out, latency_ms=9.0)  # the next good run: both, and no debris
    report = verify_bundle(archive, run_models=False)
    assert {c.name: c.status for c in report.checks}["archive"] == "ok"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle", "bundle.tar.gz"]


def test_a_stale_archive_beside_a_rebuilt_directory_is_refused(fused_dir: Path, pareto_dir: Path,
                                                               tmp_path: Path) -> None:
    """An archive from another build (an older hmt's kill, or copied back) is bound to its manifest."""
    out = tmp_path / "bundle"
    archive = archive_path_for(out)
    _deploy(fused_dir, pareto_dir, out, latency_ms=5.0)
    shutil.copyfile(archive, tmp_path / "old.tar.gz")
    _deploy(fused_dir, pareto_dir, out, latency_ms=9.0)
    shutil.copyfile(tmp_path / "old.tar.gz", archive)
    with pytest.raises(ArtifactError, match=r"bundle.tar.gz: stale: its manifest.json .* is not the one of the "
                                            r"bundle directory"):
        verify_bundle(archive, run_models=False)
    result = runner.invoke(app, ["deploy", "--verify", str(archive)])
    assert result.exit_code == ArtifactError.exit_code and "stale" in result.output
    # Elsewhere (no directory beside it) the same archive is a consistent bundle of its own.
    moved = tmp_path / "elsewhere" / "bundle.tar.gz"
    moved.parent.mkdir()
    shutil.copyfile(archive, moved)
    report = verify_bundle(moved, run_models=False)
    assert {c.name: c.status for c in report.checks}["archive"] == "skipped"
