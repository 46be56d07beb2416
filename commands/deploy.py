"""``hmt deploy``: bundle fused Pareto variants for a target; verify a bundle; push it over ssh."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from commands._options import DebugOpt, ForceOpt, JsonOpt, QuietOpt, SeedOpt
from commands._output import Output
from commands.app import app, run_command

_EPILOG = """
**Examples**

The targets, their CPU/TVM target, cross-compiler, GPU and runtimes:

    hmt deploy --list-targets

A Raspberry Pi 4 bundle of every fused variant, with serve budgets (also writes runs/bundle-rpi.tar.gz):

    hmt deploy --fused runs/fused --pareto runs/pareto --target raspberry-pi-4b --latency-ms 50 --out runs/bundle-rpi

Check a bundle (directory or .tar.gz): checksums, extra files, target, ELF machine, and a seeded run here:

    hmt deploy --verify runs/bundle-rpi.tar.gz

Build and copy to the device (your ssh keys; rsync, else scp):

    hmt deploy --fused runs/fused --pareto runs/pareto --target raspberry-pi-4b --push pi@rpi.local:/home/pi/hmt

A bundle whose variants can adapt to a new environment on the device (`hmt serve --adapt`):

    hmt deploy --fused runs/fused --pareto runs/pareto --target raspberry-pi-4b --adaptable --out runs/bundle-rpi

Jetson bundles carry no GPU code (see --list-targets): their ONNX graphs are for TensorRT on the device.

Signed bundles (bundles carry native code): make a key pair once, sign at build time, and
give the public key to verify and serve, which then refuse unsigned or differently signed bundles:

    hmt deploy --gen-key keys/hmt-sign.pem          # writes keys/hmt-sign.pem (0600) and keys/hmt-sign.pem.pub

    hmt deploy --fused runs/fused --pareto runs/pareto --target raspberry-pi-4b --sign-key keys/hmt-sign.pem

    hmt deploy --verify runs/bundle-raspberry-pi-4b.tar.gz --trusted-key keys/hmt-sign.pem.pub

    hmt serve runs/bundle-raspberry-pi-4b --trusted-key keys/hmt-sign.pem.pub

An archive carries the bundle's own signature (manifest.json and manifest.sig are its first
entries): with --trusted-key it is checked before anything else is extracted, and every other
file must be one the signed manifest lists, with its size and sha256. Extraction is bounded by
16x the archive's size + 64 MiB whatever the archive's own manifest says.

A signature binds a release version (--bundle-version, default 0) and the build time: serve
--trusted-key remembers the newest release of each key it served and refuses an older one
(a roll-back; --allow-rollback accepts it). With --offload-out and --sign-key, both halves
are signed as the same release, so `serve --trusted-key` takes them too.

OpenSSL keys work too: `openssl genpkey -algorithm ed25519 -out KEY` and
`openssl pkey -in KEY -pubout -out KEY.pub`.
"""


class EngineChoice(str, Enum):
    onnxruntime = "onnxruntime"
    tvm = "tvm"


class PushTool(str, Enum):
    auto = "auto"
    rsync = "rsync"
    scp = "scp"


def _list_targets(output: Output) -> None:
    from hmt.deploy.targets import list_targets

    targets = list_targets()
    for t in targets:
        tvm = t.tvm_target
        output.note(f"{t.name}: {t.description}")
        if t.runs_tvm:
            output.note(f"  CPU {t.arch}: TVM target {tvm.get('mtriple')} mcpu={tvm.get('mcpu')} "
                        f"mattr={','.join(tvm.get('mattr', [])) or '-'}; compiler {t.cross_compiler or 'host g++'}"
                        + (f" (apt-get install -y {t.cross_compiler_package})" if t.cross_compiler_package else ""))
        else:
            output.note(f"  CPU {t.arch}: ONNX Runtime only; {t.no_tvm_reason}")
        if t.gpu is not None:
            output.note(f"  GPU {t.gpu.name} {t.gpu.cuda_arch}: {t.gpu.code}; needs {', '.join(t.gpu.runtimes)}")
        output.note(f"  runtimes: {'; '.join(t.runtimes)}")
        output.note(f"  default profile: {t.default_profile or 'none (pass --profile)'}")
        for note in t.notes:
            output.note(f"  note: {note}")
    output.result({"targets": [t.to_json_dict() for t in targets]})


def _gen_key(output: Output, path: Path) -> None:
    from hmt.artifacts.signing import generate_key_pair, load_public_key, public_key_id

    private_path, public_path = generate_key_pair(path)
    key_id = public_key_id(load_public_key(public_path))
    output.result({"private_key": str(private_path), "public_key": str(public_path), "key_sha256": key_id},
                  f"wrote {private_path} (keep it secret) and {public_path} (give it to verify/serve "
                  f"as --trusted-key); key {key_id[:16]}...")


def _show_verify(output: Output, report: Any) -> None:
    output.table(f"verify {report.source} (target {report.target})", ["check", "status", "detail"],
                 [[c.name, c.status, c.detail] for c in report.checks])


@app.command("deploy", epilog=_EPILOG)
def deploy_command(
    fused: Annotated[Path | None, typer.Option("--fused", help="The fused artifact (from hmt fuse).")] = None,
    pareto: Annotated[Path | None, typer.Option(
        "--pareto", help="The pareto artifact the variants come from (their accuracy and predictions).")] = None,
    target: Annotated[str | None, typer.Option(
        "--target", "-t", help="Target name (see --list-targets); with --verify, the target expected.")] = None,
    profile: Annotated[Path | None, typer.Option(
        "--profile", help="Device profile (JSON file or profile-device artifact; default: the target's).")] = None,
    variants: Annotated[list[str] | None, typer.Option(
        "--variant", help="Variant arch id to bundle (repeatable; default: every fused variant).")] = None,
    engines: Annotated[list[EngineChoice] | None, typer.Option(
        "--engine", help="Engine to bundle (repeatable; default: both where the target has a TVM runtime, "
                         "ONNX Runtime only on Arm; onnxruntime is always kept).")] = None,
    strict: Annotated[bool, typer.Option(
        "--strict", help="Fail the whole bundle if any variant does not compile for the target.")] = False,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Bundle directory (replaced atomically; OUT.tar.gz beside it). "
                            "Default runs/bundle-TARGET.")] = None,
    latency_ms: Annotated[float | None, typer.Option("--latency-ms", help="serve latency budget (ms).")] = None,
    memory_mb: Annotated[float | None, typer.Option("--memory-mb", help="serve memory budget (MB).")] = None,
    energy: Annotated[float | None, typer.Option(
        "--energy-mj", "--energy", help="serve energy budget in mJ per inference (needs a front from a calibrated "
        "profile); --energy is the older spelling.")] = None,
    no_verify: Annotated[bool, typer.Option("--no-verify", help="Skip the verification after building.")] = False,
    list_targets: Annotated[bool, typer.Option("--list-targets", help="List the targets and exit.")] = False,
    verify: Annotated[Path | None, typer.Option(
        "--verify", help="Verify this bundle (directory or .tar.gz) instead of building one.")] = None,
    push: Annotated[str | None, typer.Option(
        "--push", help="Copy the bundle to [user@]host:/path over ssh (BatchMode: your keys, no prompts).")] = None,
    ssh_port: Annotated[int | None, typer.Option("--ssh-port", help="ssh port for --push.")] = None,
    ssh_identity: Annotated[Path | None, typer.Option("--ssh-identity", help="ssh key file for --push.")] = None,
    ssh_options: Annotated[list[str] | None, typer.Option(
        "--ssh-option", help="Extra ssh -o KEY=VALUE for --push (repeatable).")] = None,
    push_tool: Annotated[PushTool, typer.Option("--push-tool", help="rsync, scp, or auto.")] = PushTool.auto,
    sign_key: Annotated[Path | None, typer.Option(
        "--sign-key", help="ed25519 private key (PEM) to sign the bundle's manifest with (manifest.sig).")] = None,
    trusted_key: Annotated[Path | None, typer.Option(
        "--trusted-key", help="ed25519 public key (PEM): with --verify, refuse a bundle it did not sign.")] = None,
    bundle_version: Annotated[int, typer.Option(
        "--bundle-version", help="With --sign-key: the release version the signature binds (with the build time); "
                                 "serve --trusted-key refuses a bundle older than one it already served.")] = 0,
    gen_key: Annotated[Path | None, typer.Option(
        "--gen-key", help="Write a new ed25519 key pair to PATH (private, mode 0600) and PATH.pub, and exit.")] = None,
    adaptable: Annotated[bool, typer.Option(
        "--adaptable", help="Also bundle BN-adaptable graphs of every fp32 variant (BN un-fused, batch statistics "
                            "as outputs), for `hmt serve --adapt`; needs the supernet (the front's, or --supernet).")
    ] = False,
    canary_data: Annotated[Path | None, typer.Option(
        "--canary-data", help="With --adaptable: a labelled .npz (x: inputs or uint8 pixels, y: labels), held out "
                              "from what clients send; up to 256 samples ship as adapt/canary.npz, the set serve "
                              "--adapt checks every adapted variant against (clients cannot steer it).")] = None,
    blocks: Annotated[bool, typer.Option(
        "--blocks", help="Also ship the fp32 variants as shared block graphs (one per block choice and position of "
                         "the sub-space they span, plus exit heads): serve --blocks composes any variant of that "
                         "sub-space from them and pages blocks, not copies; needs the supernet.")] = False,
    blocks_data: Annotated[Path | None, typer.Option(
        "--blocks-data", help="With --blocks: a labelled .npz (x: model inputs, y: labels); a seeded subset of up "
                              "to 256 ships as blocks/calibration.npz, on which serve --research measures the "
                              "accuracy of the variants it finds.")] = None,
    supernet: Annotated[Path | None, typer.Option(
        "--supernet", help="With --adaptable or --blocks: the supernet the variants come from (default: the one "
                           "the pareto front records).")] = None,
    offload_out: Annotated[Path | None, typer.Option(
        "--offload-out", help="Also split the bundle (built, or the --verify one) for offloading: OUT/device "
                              "(every segment + the heads and tails of the cuts) for `hmt serve --peer`, OUT/peer "
                              "(the tails) for `hmt serve --role peer`; each cut verified against the whole "
                              "(<= 1e-5).")] = None,
    no_preprocess: Annotated[bool, typer.Option(
        "--no-preprocess", help="Build the bundle even when the input's preprocessing (normalisation) and class "
                                "names cannot be found; serve then normalises with defaults.")] = False,
    force: ForceOpt = False,
    seed: SeedOpt = 0,
    json_mode: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Bundle the chosen Pareto variants for one target: TVM libraries cross-compiled for its
    CPU, ONNX graphs for ONNX Runtime (and on-device TensorRT), early-exit segments, device
    profile, runtime index, serve config and a checksummed manifest; plus OUT.tar.gz.
    Also verifies bundles and pushes them to a device over ssh."""

    def do_push(output: Output, bundle_dir: Path) -> dict[str, Any] | None:
        if push is None:
            return None
        from hmt.deploy.push import push_bundle

        output.note(f"pushing {bundle_dir} to {push} ...")
        pushed = push_bundle(bundle_dir, push, port=ssh_port, identity=ssh_identity,
                             ssh_options=tuple(ssh_options or ()), tool=push_tool.value)
        output.note(f"pushed with {pushed.tool} to {pushed.remote_dir} in {pushed.elapsed_s:.1f} s")
        return {"destination": pushed.destination, "remote_dir": pushed.remote_dir, "tool": pushed.tool,
                "elapsed_s": round(pushed.elapsed_s, 3)}

    def do_offload(output: Output, bundle_dir: Path) -> dict[str, Any] | None:
        if offload_out is None:
            return None
        from hmt.deploy.offload import write_offload_bundles

        with output.progress() as progress:
            split = write_offload_bundles(bundle_dir, offload_out / "device", offload_out / "peer", seed=seed,
                                          sign_key=sign_key, progress=progress, force=force)
        if sign_key is None and (bundle_dir / "manifest.sig").is_file():
            output.warn(f"{bundle_dir} is signed but the offload halves are not (pass --sign-key to sign them): "
                        "serve --trusted-key refuses unsigned halves")
        output.note(f"offload: {split.cuts} cuts ({split.inner_cuts} inside segments, worst head+tail error "
                    f"{split.max_rel_error:.2g}) -> {split.device} and {split.peer}")
        return {"device": str(split.device), "peer": str(split.peer), "cuts": split.cuts,
                "inner_cuts": split.inner_cuts, "max_rel_error": split.max_rel_error,
                "plan": split.plan.to_json_dict()}

    def body(output: Output) -> None:
        from commands._checks import check_budget_flags
        from hmt.errors import UsageError

        check_budget_flags(latency_ms=latency_ms, memory_mb=memory_mb, energy=energy)
        if offload_out is not None:
            from hmt.artifacts.outputs import check_output_parent

            check_output_parent(offload_out, what="--offload-out")  # OUT/device, OUT/peer: never ./device or ~/peer

        if list_targets:
            _list_targets(output)
            return
        if gen_key is not None:
            _gen_key(output, gen_key)
            return
        if supernet is not None and not (adaptable or blocks):
            raise UsageError("--supernet goes with --adaptable or --blocks")
        if canary_data is not None and not adaptable:
            raise UsageError("--canary-data goes with --adaptable")
        if trusted_key is not None and verify is None:
            raise UsageError("--trusted-key goes with --verify (a build checks its own --sign-key signature)")
        if not 0 <= bundle_version < 1 << 63:
            raise UsageError(f"--bundle-version must be an integer in 0..2^63-1, got {bundle_version}")
        if bundle_version and sign_key is None:
            raise UsageError("--bundle-version goes with --sign-key (the signature binds it)")
        if verify is not None and sign_key is not None and offload_out is None:
            raise UsageError("--sign-key with --verify signs only the --offload-out halves; pass --offload-out")
        if verify is not None:
            if push is not None and not verify.is_dir():
                raise UsageError("--push with --verify needs a bundle directory, not an archive")
            from hmt.artifacts.signing import load_public_key
            from hmt.deploy.verify import verify_bundle

            trusted = load_public_key(trusted_key) if trusted_key is not None else None
            report = verify_bundle(verify, expected_target=target, seed=seed, trusted_key=trusted)
            _show_verify(output, report)
            pushed = do_push(output, verify)
            split = do_offload(output, verify) if verify.is_dir() else None
            output.result({**report.to_json_dict(), "push": pushed, "offload": split},
                          f"{verify}: bundle OK for {report.target}")
            return
        missing = [name for name, value in (("--fused", fused), ("--pareto", pareto), ("--target", target))
                   if value is None]
        if missing:
            why = ("; --pareto is the front hmt pareto found on the supernet the fused variants came from (a model "
                   "converted alone, convert --model or --onnx, has none: elastify it with train-supernet --model "
                   "first)") if pareto is None else ""
            raise UsageError(f"building a bundle needs {', '.join(missing)} (or use --list-targets / --verify){why}")
        assert fused is not None and pareto is not None and target is not None
        from hmt.deploy.build import DeployOptions, deploy_bundle
        from hmt.deploy.verify import verify_bundle

        out_dir = out or Path("runs") / f"bundle-{target}"
        options = DeployOptions(
            target=target, profile=profile, variants=tuple(variants or ()),
            engines=tuple(e.value for e in engines) if engines else None,
            strict=strict, latency_ms=latency_ms, memory_mb=memory_mb, energy=energy, sign_key=sign_key,
            version=bundle_version, adaptable=adaptable, supernet=supernet, allow_missing_preprocess=no_preprocess,
            canary_data=canary_data, blocks=blocks, blocks_data=blocks_data, seed=seed,
        )
        with output.progress() as progress:
            result = deploy_bundle(fused, pareto, out_dir, options=options, progress=progress, force=force)
        output.table(
            f"bundle {out_dir} for {result.target.name} (profile {result.profile_id})",
            ["variant", "engines", "preferred", "graphs", "compile s", "KiB", "TVM error"],
            [[v.arch_id, ", ".join(v.engines), v.preferred_engine, v.graphs, round(v.compile_s, 2),
              round(v.size_bytes / 1024), v.tvm_error or "-"] for v in result.variants],
        )
        for failed, reason in result.failures.items():
            output.warn(f"{failed}: TVM build for {result.target.name} failed; bundled for ONNX Runtime only "
                        f"({reason})")
        for note in result.notes:
            output.note(f"note: {note}")
        output.note(f"lineage: {result.lineage}")
        verified = None
        if not no_verify:
            from hmt.artifacts.signing import load_private_key

            own_key = load_private_key(sign_key).public_key() if sign_key is not None else None
            report = verify_bundle(out_dir, expected_target=result.target.name, seed=seed, trusted_key=own_key)
            verified = report.to_json_dict()
            output.note(f"verified: {report.summary()}")
        pushed = do_push(output, out_dir)
        split = do_offload(output, out_dir)
        size_mb = result.size_bytes / 1e6
        archive_mb = (result.archive_size_bytes or 0) / 1e6
        output.result(
            {**result.to_json_dict(), "verify": verified, "push": pushed, "offload": split},
            f"wrote {out_dir} ({size_mb:.2f} MB) and {result.archive} ({archive_mb:.2f} MB): "
            f"{len(result.variants)} variant(s) for {result.target.name} in {result.build_s:.1f} s",
        )

    run_command(body, json_mode=json_mode, quiet=quiet, debug=debug)
