"""Push over ssh against an sshd on loopback with throwaway keys (slow; skipped without sshd)."""

from __future__ import annotations

import getpass
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hmt.deploy import parse_destination, push_bundle, verify_bundle
from hmt.errors import DeviceError, UsageError

SSHD = next((p for p in ("/usr/sbin/sshd", shutil.which("sshd")) if p and Path(p).is_file()), None)


def test_destination_parsing() -> None:
    dest = parse_destination("pi@raspberrypi.local:/home/pi/hmt")
    assert (dest.user, dest.host, dest.path) == ("pi", "raspberrypi.local", "/home/pi/hmt")
    assert parse_destination("[::1]:/tmp/x").host == "[::1]"
    for bad in ("no-colon", "-oProxyCommand=evil:/x", "user@:/x", "host:"):
        with pytest.raises(UsageError, match="expected"):
            parse_destination(bad)


def test_bad_ssh_option_is_refused(x86_bundle: Path) -> None:
    with pytest.raises(UsageError, match="KEY=VALUE"):
        push_bundle(x86_bundle, "h:/x", ssh_options=["-oProxyCommand=evil"])


@dataclass(frozen=True)
class Sshd:
    port: int
    identity: Path
    options: tuple[str, ...]
    remote: Path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    if SSHD is None or shutil.which("ssh-keygen") is None:
        pytest.skip("sshd/ssh-keygen not found (apt-get install -y openssh-server)")
    keygen = ["ssh-keygen", "-q", "-t", "ed25519", "-N", ""]
    subprocess.run([*keygen, "-f", str(tmp_path / "host_key")], check=True)
    subprocess.run([*keygen, "-f", str(tmp_path / "user_key")], check=True)
    (tmp_path / "authorized_keys").write_text((tmp_path / "user_key.pub").read_text())
    port = _free_port()
    config = tmp_path / "sshd_config"
    config.write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {tmp_path / 'host_key'}",
        f"PidFile {tmp_path / 'sshd.pid'}", f"AuthorizedKeysFile {tmp_path / 'authorized_keys'}",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "PubkeyAuthentication yes",
        "PermitRootLogin prohibit-password", "StrictModes no", "UsePAM no",
        "Subsystem sftp internal-sftp", "",  # scp (OpenSSH >= 9) copies over SFTP
    ]))
    Path("/run/sshd").mkdir(exist_ok=True) if Path("/run").is_dir() else None  # privilege separation dir
    check = subprocess.run([SSHD, "-t", "-f", str(config)], capture_output=True, text=True)
    if check.returncode != 0:
        pytest.skip(f"sshd cannot run here: {check.stderr.strip()}")
    host_pub = (tmp_path / "host_key.pub").read_text().split()
    (tmp_path / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if process.poll() is not None:
                    pytest.skip(f"sshd exited: {process.stderr.read().decode() if process.stderr else ''}")
                time.sleep(0.1)
        options = (f"UserKnownHostsFile={tmp_path / 'known_hosts'}", "StrictHostKeyChecking=yes")
        yield Sshd(port, tmp_path / "user_key", options, tmp_path / "remote")
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["rsync", "scp"])
def test_push_over_ssh(sshd: Sshd, x86_bundle: Path, tool: str) -> None:
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} not installed")
    destination = f"{getpass.getuser()}@127.0.0.1:{sshd.remote}"
    result = push_bundle(x86_bundle, destination, port=sshd.port, identity=sshd.identity,
                         ssh_options=sshd.options, tool=tool)
    assert result.tool == tool and Path(result.remote_dir) == sshd.remote / x86_bundle.name
    verify_bundle(result.remote_dir, run_models=False)  # the copy is complete and intact


@pytest.mark.slow
def test_push_with_unknown_host_key_fails_without_prompting(sshd: Sshd, x86_bundle: Path, tmp_path: Path) -> None:
    (tmp_path / "empty_known_hosts").write_text("")
    with pytest.raises(DeviceError, match="failed"):
        push_bundle(x86_bundle, f"{getpass.getuser()}@127.0.0.1:{sshd.remote}", port=sshd.port,
                    identity=sshd.identity, timeout_s=30,
                    ssh_options=(f"UserKnownHostsFile={tmp_path / 'empty_known_hosts'}", "StrictHostKeyChecking=yes"))
    assert not sshd.remote.exists()


@pytest.mark.slow
def test_push_never_replaces_a_remote_folder_that_is_not_a_bundle(sshd: Sshd, x86_bundle: Path) -> None:
    from hmt.errors import InputError

    mine = sshd.remote / x86_bundle.name
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("precious")
    with pytest.raises(InputError, match="is a folder that is not an hmt bundle"):
        push_bundle(x86_bundle, f"{getpass.getuser()}@127.0.0.1:{sshd.remote}", port=sshd.port,
                    identity=sshd.identity, ssh_options=sshd.options, tool="scp")
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["rsync", "scp"])
def test_a_second_push_replaces_an_older_bundle_leaving_no_stale_file(sshd: Sshd, x86_bundle: Path,
                                                                       tmp_path: Path, tool: str) -> None:
    """scp -r merged into the remote folder: a file of the older bundle that the new one does not have
    stayed, and serve there refused the bundle ('files not in manifest.json')."""
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} not installed")
    destination = f"{getpass.getuser()}@127.0.0.1:{sshd.remote}"
    older = tmp_path / x86_bundle.name
    shutil.copytree(x86_bundle, older)
    (older / "variants" / "stale.onnx").write_bytes(b"an older bundle's file")
    first = push_bundle(older, destination, port=sshd.port, identity=sshd.identity, ssh_options=sshd.options,
                        tool=tool)
    assert (Path(first.remote_dir) / "variants" / "stale.onnx").is_file()
    second = push_bundle(x86_bundle, destination, port=sshd.port, identity=sshd.identity,
                         ssh_options=sshd.options, tool=tool)
    assert not (Path(second.remote_dir) / "variants" / "stale.onnx").exists()
    verify_bundle(second.remote_dir, run_models=False)
    assert sorted(p.name for p in sshd.remote.iterdir()) == [x86_bundle.name]  # no staging folder left
