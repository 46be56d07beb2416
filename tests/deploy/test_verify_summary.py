"""The one-line verification summary deploy prints after a build."""

from __future__ import annotations

from pathlib import Path

from hmt.deploy.verify import VerifyReport


def test_summary_names_why_each_check_was_skipped() -> None:
    """An unsigned x86-64 bundle skips only the signature check; the line used to blame
    'libraries for another CPU' for every skipped check."""
    report = VerifyReport(Path("b"), "x86-64", ["v"])
    report.add("checksums", "ok", "3 files match")
    report.add("signature", "skipped", "not signed")
    report.add("run v [tvm]", "skipped", "libraries are for aarch64; this host is x86_64")
    report.add("run v [onnxruntime]", "ok")
    line = report.summary()
    assert line == ("2 checks ok, 2 skipped (signature: not signed; "
                    "run v [tvm]: libraries are for aarch64; this host is x86_64)")
    assert "another CPU" not in line


def test_summary_without_skips() -> None:
    report = VerifyReport(Path("b"), "x86-64", ["v"])
    report.add("checksums", "ok")
    assert report.summary() == "1 checks ok"
