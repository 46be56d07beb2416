"""BN statistics re-estimation on the device: numpy and ONNX Runtime, no torch, no onnx.

Reads a ``bn-adaptable`` artifact (``hmt.adapt.bn_export``, checksums verified), runs
recent input batches through the stats graphs (segment to segment, each exit head on
its segment's output, as torch's train-mode ``forward_all`` does) and accumulates every
layer's statistics as torch does with momentum None: the running mean is the mean of the
batch means, the running variance the mean of the unbiased batch variances. The adapted
model is the inference graphs with the new ``scale``/``shift`` written into their bytes at
the recorded offsets, opened as new ORT sessions (ORT folds them into the convs): a new
variant, the original left as it was, so serve can switch back when the drift passes.

The hook for ``hmt serve --adapt``: ``BnReestimator.observe(batch)`` for each batch of
recent inputs (cheap: one run of the stats graphs), then ``adapted()`` for the graphs
to serve, and ``reset()`` when the drift has passed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hmt.artifacts import Artifact, load_artifact
from hmt.compat import strict_zip
from hmt.errors import ArtifactError, InputError, UsageError

BN_ADAPTABLE_KIND = "bn-adaptable"  # the same string as hmt.adapt.bn_export (which needs torch)
BN_SPEC_NAME = "bn.json"


@dataclass(frozen=True)
class BnLayer:
    scale_offset: int  # byte offset of the float32 scale in the inference graph's file
    shift_offset: int
    channels: int
    eps: float
    per_sample: int
    weight: np.ndarray | None
    bias: np.ndarray | None
    running_mean: np.ndarray
    running_var: np.ndarray


@dataclass(frozen=True)
class BnGraph:
    name: str
    reads_segment: int | None
    stats_path: Path
    infer_path: Path
    layers: tuple[BnLayer, ...]


def _array(value: Any, where: str) -> np.ndarray | None:
    if value is None:
        return None
    try:
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ArtifactError(f"{where}: expected a list of numbers ({exc})") from exc


def _graphs_of_spec(spec: Any, where: str, resolve: Callable[[str], Path]) -> list[BnGraph]:
    graphs = []
    try:
        for g in spec["graphs"]:
            layers = []
            for k, layer in enumerate(g["layers"]):
                at = f"{where}: graphs[{g['name']}].layers[{k}]"
                layers.append(BnLayer(
                    scale_offset=int(layer["scale_offset"]), shift_offset=int(layer["shift_offset"]),
                    channels=int(layer["channels"]), eps=float(layer["eps"]),
                    per_sample=int(layer["per_sample"]), weight=_array(layer["weight"], at),
                    bias=_array(layer["bias"], at),
                    running_mean=_array(layer["running_mean"], at),  # type: ignore[arg-type]
                    running_var=_array(layer["running_var"], at),  # type: ignore[arg-type]
                ))
            reads = g.get("reads_segment")
            graphs.append(BnGraph(str(g["name"]), None if reads is None else int(reads),
                                  resolve(str(g["stats"])), resolve(str(g["infer"])), tuple(layers)))
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"{where}: malformed ({exc!r})") from exc
    return graphs


@dataclass(frozen=True)
class BnSource:
    """What re-estimation reads: ``bn.json`` and its graph files, every one checked against a
    manifest (a ``bn-adaptable`` artifact's, or a bundle's for ``deploy --adaptable``)."""

    spec: dict[str, Any]
    graphs: tuple[BnGraph, ...]
    where: str


def load_bn_graphs(path: Path | str) -> tuple[Artifact, list[BnGraph]]:
    artifact = load_artifact(path, kind=BN_ADAPTABLE_KIND)
    source = bn_source_in(artifact, "")
    return artifact, list(source.graphs)


def bn_source_in(artifact: Artifact, folder: str) -> BnSource:
    """The BN-adaptable graphs in ``folder`` of ``artifact`` ("" for a bn-adaptable artifact's
    root; ``variants/<arch>/adapt`` in a bundle); every file must be one its manifest lists."""
    prefix = f"{folder.rstrip('/')}/" if folder else ""
    spec = artifact.read_json(f"{prefix}{BN_SPEC_NAME}")
    where = str(artifact.file(f"{prefix}{BN_SPEC_NAME}"))
    if not isinstance(spec, dict):
        raise ArtifactError(f"{where}: expected a JSON object")
    graphs = _graphs_of_spec(spec, where, lambda name: artifact.file(f"{prefix}{name}"))
    return BnSource(spec, tuple(graphs), where)


def _session(source: Path | bytes, threads: int = 1) -> Any:
    """An ONNX Runtime session built by the runtime layer (the one place sessions are made)."""
    from hmt.runtime.ort import OrtOptions, ort_session

    options = OrtOptions(intra_op_threads=threads, inter_op_threads=1)
    return ort_session(source, options, what=str(source) if isinstance(source, Path) else "an adapted graph").session


def patched_graph(graph: BnGraph, affine: list[tuple[np.ndarray, np.ndarray]]) -> bytes:
    """The inference graph's bytes with each BN's scale/shift written at its offset."""
    blob = bytearray(graph.infer_path.read_bytes())
    for layer, (scale, shift) in strict_zip(graph.layers, affine):
        for offset, value in ((layer.scale_offset, scale), (layer.shift_offset, shift)):
            data = np.ascontiguousarray(value, dtype="<f4").tobytes()
            if len(data) != 4 * layer.channels or offset < 0 or offset + len(data) > len(blob):
                raise ArtifactError(f"{graph.infer_path}: BN offset {offset} or size {len(data)} does not fit")
            blob[offset:offset + len(data)] = data
    return bytes(blob)


def _affine(layer: BnLayer, mean: np.ndarray, var: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eval-mode BN as y = x * scale + shift (as hmt.adapt.bn_export.affine_of)."""
    inv = 1.0 / np.sqrt(var + layer.eps)
    scale = inv * layer.weight if layer.weight is not None else inv
    shift = -mean * scale + (layer.bias if layer.bias is not None else 0.0)
    return scale, shift


class BnReestimator:
    """Accumulates BN statistics of recent inputs and builds the adapted inference graphs."""

    def __init__(self, source: Path | str | BnSource, *, threads: int = 1) -> None:
        if not isinstance(source, BnSource):
            source = bn_source_in(load_artifact(source, kind=BN_ADAPTABLE_KIND), "")
        self.spec = source.spec
        self.graphs = list(source.graphs)
        self.threads = threads
        self._stats = {g.name: _session(g.stats_path, threads=threads) for g in self.graphs}
        self._input_name = {g.name: self._stats[g.name].get_inputs()[0].name for g in self.graphs}
        self._shipped: AdaptedChain | None = None
        self.reset()

    def reset(self) -> None:
        """Forget every batch observed (the drift has passed: back to the shipped statistics)."""
        self.batches = 0
        self._sum_mean = {g.name: [np.zeros_like(lay.running_mean) for lay in g.layers] for g in self.graphs}
        self._sum_var = {g.name: [np.zeros_like(lay.running_var) for lay in g.layers] for g in self.graphs}

    def observe(self, x: np.ndarray) -> None:
        """One batch (N >= 2) of model inputs, normalised as the model expects."""
        if x.ndim < 2 or x.shape[0] < 2:
            raise InputError(f"BN re-estimation needs batches of at least 2 inputs, got shape {x.shape}")
        x = np.ascontiguousarray(x, dtype=np.float32)
        segment_out: list[np.ndarray] = []
        h = x
        for g in self.graphs:
            source = segment_out[g.reads_segment] if g.reads_segment is not None else h
            outputs = self._stats[g.name].run(None, {self._input_name[g.name]: source})
            for k, layer in enumerate(g.layers):
                mean = outputs[1 + 2 * k].astype(np.float64)
                var = outputs[2 + 2 * k].astype(np.float64)
                n = x.shape[0] * layer.per_sample
                self._sum_mean[g.name][k] += mean
                self._sum_var[g.name][k] += var * n / max(n - 1, 1)  # unbiased, as torch's running_var
            if g.reads_segment is None:
                segment_out.append(outputs[0])
                h = outputs[0]
        self.batches += 1

    def statistics(self) -> dict[str, list[tuple[np.ndarray, np.ndarray]]]:
        """Per graph, per layer (running_mean, running_var): re-estimated, or shipped if no batch yet."""
        out = {}
        for g in self.graphs:
            if self.batches == 0:
                out[g.name] = [(lay.running_mean, lay.running_var) for lay in g.layers]
            else:
                out[g.name] = [(self._sum_mean[g.name][k] / self.batches, self._sum_var[g.name][k] / self.batches)
                               for k in range(len(g.layers))]
        return out

    def affine(self) -> dict[str, list[tuple[np.ndarray, np.ndarray]]]:
        """Per graph, per layer, (scale, shift) of the adapted eval-mode BN."""
        stats = self.statistics()
        return {g.name: [_affine(layer, mean, var) for layer, (mean, var) in strict_zip(g.layers, stats[g.name])]
                for g in self.graphs}

    def adapted(self) -> AdaptedChain:
        """ORT sessions of the inference graphs with the re-estimated statistics written in."""
        if self.batches == 0:
            raise UsageError("no batch observed yet: nothing to adapt to")
        affine = self.affine()
        return AdaptedChain({g.name: _session(patched_graph(g, affine[g.name]), self.threads) for g in self.graphs},
                            self.graphs)

    def shipped(self) -> AdaptedChain:
        """The inference graphs as shipped (the unadapted variant); sessions built once."""
        if self._shipped is None:
            self._shipped = AdaptedChain({g.name: _session(g.infer_path, self.threads) for g in self.graphs},
                                         self.graphs)
        return self._shipped


class AdaptedChain:
    """Runs the inference graphs: ``run(x)`` returns the logits of every exit (or the model's output)."""

    def __init__(self, sessions: dict[str, Any], graphs: list[BnGraph]) -> None:
        self._graphs = graphs
        self._run: dict[str, Callable[[np.ndarray], np.ndarray]] = {
            g.name: self._runner(sessions[g.name]) for g in graphs}

    def graph_fn(self, name: str) -> Callable[[np.ndarray], np.ndarray]:
        """One graph of the chain (``segment_k``, ``exit_k``) as a function of its input."""
        if name not in self._run:
            raise UsageError(f"no graph {name!r} in the adapted chain ({', '.join(self._run)})")
        return self._run[name]

    @staticmethod
    def _runner(session: Any) -> Callable[[np.ndarray], np.ndarray]:
        name = session.get_inputs()[0].name

        def run(x: np.ndarray) -> np.ndarray:
            return np.asarray(session.run(None, {name: x})[0])

        return run

    def run_last(self, x: np.ndarray) -> np.ndarray:
        """The final exit's logits only: every segment, then the last exit head."""
        h = np.ascontiguousarray(x, dtype=np.float32)
        segments = [g for g in self._graphs if g.reads_segment is None]
        for g in segments:
            h = self._run[g.name](h)
        heads = [g for g in self._graphs if g.reads_segment is not None]
        return self._run[heads[-1].name](h) if heads else h

    def run(self, x: np.ndarray) -> list[np.ndarray]:
        x = np.ascontiguousarray(x, dtype=np.float32)
        segment_out: list[np.ndarray] = []
        logits = []
        h = x
        for g in self._graphs:
            if g.reads_segment is None:
                h = self._run[g.name](h)
                segment_out.append(h)
                if g.name == "model":
                    logits.append(h)
            else:
                logits.append(self._run[g.name](segment_out[g.reads_segment]))
        return logits
