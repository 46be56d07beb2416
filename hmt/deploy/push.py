"""``deploy --push user@host:/path``: copy a bundle to a device over ssh.

rsync when it is installed here (only changed files travel; ``--delete`` inside the
bundle's own folder so the copy matches the manifest), else scp (into a staging folder beside
it, swapped in whole: scp merges into a folder). Both run as
subprocesses through the user's own ssh: no credentials are stored or asked for, and
``BatchMode=yes`` makes a missing key or an unknown host key fail at once instead of
prompting. The bundle lands in ``/path/<bundle folder name>``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hmt.errors import DeviceError, InputError, UsageError

# [user@]host:path, where host is a name, an IPv4 address or a [bracketed] IPv6 address.
_DESTINATION = re.compile(r"^(?:(?P<user>[A-Za-z0-9._][A-Za-z0-9._-]*)@)?"
                          r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]*):(?P<path>.+)$")
_TAIL_LINES = 5


@dataclass(frozen=True)
class Destination:
    user: str | None
    host: str
    path: str

    @property
    def login(self) -> str:
        return f"{self.user}@{self.host}" if self.user else self.host

    def __str__(self) -> str:
        return f"{self.login}:{self.path}"


@dataclass(frozen=True)
class PushResult:
    destination: str
    remote_dir: str
    tool: str
    elapsed_s: float


def parse_destination(text: str) -> Destination:
    match = _DESTINATION.match(text)
    if match is None or "\n" in text:
        raise UsageError(f"--push {text!r}: expected [user@]host:/path (e.g. pi@raspberrypi.local:/home/pi/hmt)")
    return Destination(match["user"], match["host"], match["path"])


def _ssh_command(*, port: int | None, identity: Path | None, options: Sequence[str]) -> list[str]:
    command = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=15"]
    if port is not None:
        command += ["-p", str(port)]
    if identity is not None:
        command += ["-i", str(identity), "-o", "IdentitiesOnly=yes"]
    for option in options:
        command += ["-o", option]
    return command


def _run(command: list[str], what: str, timeout_s: float) -> str:
    """Run ``command``; its stdout. DeviceError, naming ``what``, when it is missing, times out or fails."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError as exc:
        raise DeviceError(f"{what}: {command[0]} is not installed here") from exc
    except subprocess.TimeoutExpired as exc:
        raise DeviceError(f"{what}: no answer within {timeout_s:.0f} s") from exc
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-_TAIL_LINES:])
        raise DeviceError(f"{what} failed (exit {done.returncode}): {tail or 'no message'}")
    return done.stdout


_REFUSED = "hmt-push-refused"


def _check_remote(ssh: list[str], dest: Destination, remote_dir: str, destination: str, timeout_s: float) -> None:
    """``mkdir -p`` the destination; refuse (exit 3) a ``remote_dir`` that exists, is not empty and
    holds no hmt bundle manifest (or is a link), touching nothing there."""
    target = shlex.quote(remote_dir)
    script = (f"mkdir -p -- {shlex.quote(dest.path)} || exit 1; "
              f"if [ -L {target} ] || {{ [ -e {target} ] && [ -n \"$(ls -A -- {target})\" ] && "
              f"! grep -qs '\"kind\": \"bundle\"' {target}/manifest.json; }}; then echo {_REFUSED}; fi")
    if _REFUSED in _remote(ssh, dest, script, timeout_s):
        raise InputError(f"--push {destination}: {remote_dir} on {dest.host} is a folder that is not an hmt bundle; "
                         "the copy would replace what is in it. Choose another remote path, or move it")


def push_bundle(bundle_dir: Path | str, destination: str, *, port: int | None = None, identity: Path | None = None,
                ssh_options: Sequence[str] = (), tool: str = "auto", timeout_s: float = 600.0) -> PushResult:
    """Copy the bundle directory to ``destination`` ([user@]host:/path) with rsync or scp."""
    bundle_dir = Path(os.path.abspath(bundle_dir))
    if not bundle_dir.is_dir():
        raise UsageError(f"{bundle_dir}: push needs the bundle directory")
    if tool not in ("auto", "rsync", "scp"):
        raise UsageError(f"push tool {tool!r}: expected auto, rsync or scp")
    for option in ssh_options:
        if option.startswith("-") or "\n" in option:
            raise UsageError(f"--ssh-option {option!r}: expected KEY=VALUE (passed to ssh as -o KEY=VALUE)")
    dest = parse_destination(destination)
    if identity is not None and not Path(identity).is_file():
        raise UsageError(f"--ssh-identity {identity}: does not exist; expected an ssh key file")
    ssh = _ssh_command(port=port, identity=identity, options=ssh_options)
    use = tool if tool != "auto" else ("rsync" if shutil.which("rsync") else "scp")
    remote_dir = f"{dest.path.rstrip('/')}/{bundle_dir.name}"
    start = time.perf_counter()
    # Create the parent first: it checks login with a clear message, and rsync/scp need it. The
    # same call refuses a remote folder that is not an hmt bundle: rsync --delete would empty it.
    _check_remote(ssh, dest, remote_dir, destination, timeout_s)
    if use == "rsync":
        _run(["rsync", "-rt", "--delete", "--chmod=D755,F644", "-e", shlex.join(ssh), f"{bundle_dir}/",
              f"{dest.login}:{remote_dir}/"], f"rsync to {dest}", timeout_s)
    else:
        _scp_and_swap(ssh, dest, bundle_dir, remote_dir, port, timeout_s)
    return PushResult(str(dest), remote_dir, use, time.perf_counter() - start)


def _scp_and_swap(ssh: list[str], dest: Destination, bundle_dir: Path, remote_dir: str, port: int | None,
                  timeout_s: float) -> None:
    """scp into a fresh staging folder beside ``remote_dir``, then swap it in: ``scp -r`` merges into an
    existing folder, so an older bundle's files that the new one lacks stayed, and serve there refused
    the bundle. The folder replaced was checked to be an hmt bundle (:func:`_check_remote`)."""
    staging = _remote(ssh, dest, f"mktemp -d -- {shlex.quote(dest.path.rstrip('/') + '/.hmt-push.XXXXXX')}",
                      timeout_s).strip()
    if not staging.startswith(dest.path.rstrip("/") + "/.hmt-push.") or "\n" in staging:
        raise DeviceError(f"ssh {dest.login}: mktemp gave an unexpected path {staging!r}")
    scp = ["scp", "-B", "-r", *ssh[1:]]
    if port is not None:
        # scp spells the port -P; -p means "preserve times" to it.
        index = scp.index("-p")
        scp[index] = "-P"
    new, old = shlex.quote(f"{staging}/{bundle_dir.name}"), shlex.quote(f"{staging}/old")
    target = shlex.quote(remote_dir)
    try:
        _run([*scp, str(bundle_dir), f"{dest.login}:{staging}/"], f"scp to {dest}", timeout_s)
        _remote(ssh, dest, f"if [ -e {target} ]; then mv -- {target} {old} || exit 1; fi; "
                           f"mv -- {new} {target}", timeout_s)
    finally:
        _remote(ssh, dest, f"rm -rf -- {shlex.quote(staging)}", timeout_s)


def _remote(ssh: list[str], dest: Destination, script: str, timeout_s: float) -> str:
    """Run ``script`` on ``dest``'s host; its stdout. DeviceError when it fails."""
    return _run([*ssh, "--", dest.login, script], f"ssh {dest.login}", timeout_s)
