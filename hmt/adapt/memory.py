"""The memory-saving techniques of the TENT path's training engine (CrowdHMTware III-C2;
the engine itself is :mod:`hmt.adapt.engine`).

Three techniques, each switchable, around a model seen as a chain of blocks with exit
heads (a materialised supernet variant, or any ``nn.Sequential``):

- **8-bit activation compression.** ``Int8SavedTensors`` packs every activation autograd
  saves for backward into uint8 with a per-channel min and scale, and unpacks it when the
  backward pass needs it (``torch.autograd.graph.saved_tensors_hooks``). Parameters and
  buffers are never compressed (their gradients would be wrong), tensors shared by
  several operators (a ReLU's output is also the next conv's input) are packed once.
- **Recomputation chosen by a memory budget.** ``plan_checkpoints`` measures what each
  block saves on the actual batch and recomputes the shortest prefix of the chain, cut
  into runs, whose estimate fits the budget; a run keeps only its input and runs again in
  the backward pass (its BN running statistics are not updated twice).
- **Backward order that frees early.** Each trainable parameter is updated by its own
  optimizer as soon as its gradient has been accumulated
  (``register_post_accumulate_grad_hook``), and the gradient is dropped at once, instead
  of keeping every gradient until one ``optimizer.step()`` after the backward pass.

``peak_bytes`` measures the peak of what the torch allocator holds during a call: on
CUDA ``max_memory_allocated``, on a CPU the allocation events of torch's profiler.

The budget bounds the *saved activations* the plan estimates, not the allocator's peak.
Measured on the 2-core development CPU (ResNet-20, batch 128, one TENT step, 2026-11-26): plain
autograd peaks at 200 MiB, 8-bit compression at 74 MiB (0.37x); recomputation under a
budget of half the compressed estimate lowers that estimate from 64 to 38 MiB but not
the measured peak (76 MiB), which is then set by transient buffers of the convolution
backward (a contiguous copy inside ``convolution_backward``), not by what is saved.
Recomputation pays where saved activations dominate: deeper chains, larger batches.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from hmt.errors import BudgetError, UsageError

# Below this many elements a saved tensor (BN's per-channel mean and inverse std, a
# scalar) costs more to compress than it saves.
MIN_COMPRESS_NUMEL = 4096


# -- measuring ---------------------------------------------------------------------------


def peak_bytes(fn: Callable[[], Any], *, device: torch.device | str = "cpu") -> int:
    """Peak bytes the torch allocator holds during ``fn()`` above what it held before."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - base)
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.typed[0] == _EventType.Allocation:
            events.append((event.start_time_ns, int(event.typed[1].alloc_size)))
    events.sort()
    held = peak = 0
    for _, size in events:  # frees are negative sizes
        held += size
        peak = max(peak, held)
    return peak


class SavedTensorMeter:
    """Bytes autograd holds for backward, live and at their peak, as the engine keeps them.

    Every saved activation goes through a pack hook (:class:`Int8SavedTensors`, which the
    engine always enters when a meter is set, compressing or not); the hook wraps what it
    keeps in a holder whose bytes count from packing until autograd drops it (after the
    node's backward, or with the graph). A tensor saved by several nodes counts once.
    Parameters and buffers are not counted (the model holds them anyway).
    """

    def __init__(self) -> None:
        self.live_bytes = 0
        self.peak_bytes = 0

    def reset(self) -> None:
        self.peak_bytes = self.live_bytes

    def hold(self, value: Any, size_bytes: int) -> _Held:
        self.live_bytes += size_bytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return _Held(value, size_bytes, self)


class _Held:
    """What a metered pack hook returns; its bytes stop counting when autograd lets it go."""

    __slots__ = ("__weakref__", "meter", "size_bytes", "value")

    def __init__(self, value: Any, size_bytes: int, meter: SavedTensorMeter) -> None:
        self.value = value
        self.size_bytes = size_bytes
        self.meter = meter

    def __del__(self) -> None:
        self.meter.live_bytes -= self.size_bytes


def _nbytes(packed: Any) -> int:
    if isinstance(packed, _Packed):
        return packed.q.numel() + (packed.low.numel() + packed.scale.numel()) * packed.low.element_size()
    return int(packed.numel() * packed.element_size())


def pin_mmap_threshold(threshold_bytes: int = 128 * 1024) -> bool:
    """Make glibc serve every allocation of ``threshold_bytes`` or more with its own mmap, so
    that freeing it returns the pages to the system at once. Process-wide; False where the
    C library is not glibc.

    Why: glibc raises its mmap threshold to the size of each large block freed (up to 32
    MiB), after which activation-sized blocks come from the heap and stay resident when
    freed, interleaved with the small 8-bit blocks the engine keeps. Measured on this CPU
    (ResNet-56 variant, batch 128, one TENT step in a fresh process): 8-bit compression cut
    the allocator's peak to 0.29x of plain autograd but the resident peak only to 0.71x;
    with the threshold pinned the resident peak followed (0.22x). The price is a page fault
    per fresh page of every activation: the same step took 3.4x as long (0.40 -> 1.35 s;
    benchmarks/adapt/results/memory_heap.json); ``EngineOptions(return_freed_memory=False)`` keeps speed.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_mmap_threshold = -3  # glibc's M_MMAP_THRESHOLD
    return bool(mallopt(m_mmap_threshold, int(threshold_bytes)) == 1)


# -- 8-bit compression of saved activations ------------------------------------------------


@dataclass(frozen=True)
class _Packed:
    q: torch.Tensor  # uint8
    low: torch.Tensor
    scale: torch.Tensor
    dtype: torch.dtype


def quantize_u8(t: torch.Tensor) -> _Packed:
    """Per-channel (dim 1) affine uint8 quantisation: max error scale / 2 per element."""
    dims = [d for d in range(t.dim()) if d != 1] if t.dim() >= 2 else list(range(t.dim()))
    detached = t.detach()
    low = detached.amin(dim=dims, keepdim=True)
    scale = (detached.amax(dim=dims, keepdim=True) - low).clamp_min(1e-12) / 255.0
    q = (detached - low).div_(scale).round_().clamp_(0, 255).to(torch.uint8)
    return _Packed(q, low, scale, t.dtype)


def dequantize_u8(p: _Packed) -> torch.Tensor:
    return p.q.to(p.dtype).mul_(p.scale).add_(p.low)


class Int8SavedTensors:
    """Context manager compressing saved activations to 8 bits (see the module doc).

    ``exclude`` holds tensors never to compress (the model's parameters and buffers).
    ``saved_bytes`` counts what is kept (packed or not) while active, for the planner.
    """

    def __init__(self, exclude: Sequence[torch.Tensor] = (), *, compress: bool = True,
                 min_numel: int = MIN_COMPRESS_NUMEL, meter: SavedTensorMeter | None = None) -> None:
        self._exclude = {t.data_ptr() for t in exclude}
        self.compress = compress
        self.meter = meter
        self.min_numel = min_numel
        self.saved_bytes = 0
        self.raw_bytes = 0
        self._seen: dict[tuple[Any, ...], tuple[weakref.ref[torch.Tensor], Any]] = {}
        self._hooks: Any = None

    def _pack(self, t: torch.Tensor) -> Any:
        if t.data_ptr() in self._exclude:
            return t
        # Never keep ``t`` itself: when it is the node's own output (a ReLU saves its result),
        # the node would hold the tensor that holds the node, a cycle Python's collector
        # cannot see through, and every such activation leaked (measured: 8-20 MiB per block
        # of a ResNet-56 variant at batch 128). ``detach()`` shares storage and version counter.
        if not t.is_floating_point() or t.numel() < self.min_numel:
            return t.detach() if self.meter is None else self.meter.hold(t.detach(), _nbytes(t))
        key = (t.data_ptr(), t.dtype, tuple(t.shape), t.stride(), t._version)
        hit = self._seen.get(key)
        # The weak reference tells a tensor saved twice from a new one that reuses freed memory.
        if hit is not None and hit[0]() is t:
            cached = hit[1]() if isinstance(hit[1], weakref.ref) else hit[1]
            if cached is not None:
                return cached
        packed: Any = quantize_u8(t) if self.compress else t.detach()
        self.raw_bytes += t.numel() * t.element_size()
        self.saved_bytes += packed.q.numel() if isinstance(packed, _Packed) else t.numel() * t.element_size()
        if self.meter is not None:
            packed = self.meter.hold(packed, _nbytes(packed))
        # The cache holds the holder weakly: it must not keep a saved tensor alive by itself.
        self._seen[key] = (weakref.ref(t), packed if self.meter is None else weakref.ref(packed))
        return packed

    @staticmethod
    def _unpack(packed: Any) -> torch.Tensor:
        if isinstance(packed, _Held):
            packed = packed.value
        return dequantize_u8(packed) if isinstance(packed, _Packed) else packed

    def __enter__(self) -> Int8SavedTensors:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)
        self._seen.clear()


# -- the chain and its checkpoint plan ------------------------------------------------------


@dataclass
class Chain:
    """A model as segments of blocks; ``heads[i]`` (or None) reads segment ``i``'s output."""

    segments: list[list[nn.Module]]
    heads: list[nn.Module | None]

    @property
    def blocks(self) -> list[nn.Module]:
        return [b for seg in self.segments for b in seg]


def as_chain(model: nn.Module) -> Chain:
    """A materialised variant (``segments`` + ``exit_heads``) or an ``nn.Sequential``."""
    segments = getattr(model, "segments", None)
    heads = getattr(model, "exit_heads", None)
    if segments is not None and heads is not None:
        return Chain([list(seg.children()) if isinstance(seg, nn.Sequential) else [seg] for seg in segments],
                     list(heads))
    if isinstance(model, nn.Sequential):
        return Chain([list(model.children())], [None])
    raise UsageError(f"{type(model).__name__}: the memory-saving engine needs a variant (segments + exit heads) "
                     "or an nn.Sequential")


@contextmanager
def _frozen_running_stats(module: nn.Module) -> Iterator[None]:
    # Recomputing a checkpointed block in the backward pass must not count its batch twice.
    norms = [m for m in module.modules() if isinstance(m, _BatchNorm)]
    saved = [(m.momentum, m.num_batches_tracked.clone() if m.num_batches_tracked is not None else None)
             for m in norms]
    for m in norms:
        m.momentum = 0.0
    try:
        yield
    finally:
        for m, (momentum, tracked) in zip(norms, saved, strict=True):
            m.momentum = momentum
            if tracked is not None and m.num_batches_tracked is not None:
                m.num_batches_tracked.copy_(tracked)


def _run_span(blocks: Sequence[nn.Module], h: torch.Tensor) -> torch.Tensor:
    for block in blocks:
        h = block(h)
    return h


class _Recompute(torch.autograd.Function):
    """Run ``blocks`` without keeping what they save; keep only their input (8-bit when
    ``compress``) and run them again in the backward pass. The parameters' gradients are
    accumulated by the inner backward, so per-parameter update hooks fire from there."""

    @staticmethod
    def forward(ctx: Any, blocks: Sequence[nn.Module], compress: bool, meter: SavedTensorMeter | None,
                x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        ctx.blocks = blocks
        ctx.compress = compress
        ctx.meter = meter
        ctx.x_requires_grad = x.requires_grad
        packed: Any = quantize_u8(x) if compress and x.numel() >= MIN_COMPRESS_NUMEL else x.detach()
        ctx.packed = packed if meter is None else meter.hold(packed, _nbytes(packed))
        with torch.no_grad():
            return _run_span(blocks, x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        packed = ctx.packed.value if isinstance(ctx.packed, _Held) else ctx.packed
        x = (dequantize_u8(packed) if isinstance(packed, _Packed) else packed).detach()
        del packed
        x.requires_grad_(ctx.x_requires_grad)
        holder = nn.ModuleList(ctx.blocks)
        exclude = [*holder.parameters(), *holder.buffers()]
        with torch.enable_grad(), _frozen_running_stats(holder), \
                Int8SavedTensors(exclude, compress=ctx.compress, meter=ctx.meter):
            out = _run_span(ctx.blocks, x)
        del ctx.packed  # the kept input goes before the run's backward allocates
        torch.autograd.backward(out, grad)
        del out
        n_params = sum(1 for _ in holder.parameters())
        return (None, None, None, x.grad if ctx.x_requires_grad else None, *([None] * n_params))


def _run_checkpointed(blocks: Sequence[nn.Module], h: torch.Tensor, compress: bool,
                      meter: SavedTensorMeter | None = None) -> torch.Tensor:
    params = [p for b in blocks for p in b.parameters()]
    return _Recompute.apply(blocks, compress, meter, h, *params)


Runs = tuple[tuple[int, int], ...]
"""Checkpointed runs of blocks, (first, last + 1) in chain order, never across an exit."""


def run_chain(chain: Chain, x: torch.Tensor, runs: Runs = (), *, compress: bool = False,
              meter: SavedTensorMeter | None = None) -> list[torch.Tensor]:
    """Logits of every exit (segments without a head give their output as the logits).
    Each run of ``runs`` keeps only its input (8-bit with ``compress``) and is recomputed
    in the backward pass."""
    starts = dict(runs)
    blocks = chain.blocks
    outputs = []
    h = x
    k = 0
    for segment, head in zip(chain.segments, chain.heads, strict=True):
        end = k + len(segment)
        while k < end:
            if k in starts:
                h = _run_checkpointed(blocks[k:starts[k]], h, compress, meter)
                k = starts[k]
            else:
                h = blocks[k](h)
                k += 1
        outputs.append(head(h) if head is not None else h)
    return outputs


@dataclass(frozen=True)
class BlockCost:
    """Measured on one batch: what a block saves for backward (``saved_bytes`` as the
    engine keeps it, compressed or not, also while recomputing; ``raw_bytes`` what plain
    autograd keeps) and the size of its input."""

    saved_bytes: int
    raw_bytes: int
    input_bytes: int  # as a recomputed run keeps it (8-bit when compressing)


@dataclass(frozen=True)
class CheckpointPlan:
    """Which runs of blocks recompute, and the measured numbers the choice came from."""

    runs: Runs
    costs: tuple[BlockCost, ...]
    head_bytes: int
    estimated_bytes: int  # kept activations + the largest recomputed run
    plain_estimated_bytes: int  # the same without recomputation
    budget_bytes: int | None

    def to_json_dict(self) -> dict[str, Any]:
        return {"runs": [list(r) for r in self.runs], "estimated_bytes": self.estimated_bytes,
                "plain_estimated_bytes": self.plain_estimated_bytes, "budget_bytes": self.budget_bytes,
                "block_saved_bytes": [c.saved_bytes for c in self.costs]}


def estimate_bytes(costs: Sequence[BlockCost], runs: Runs, head_bytes: int) -> int:
    """Activations held at the end of the forward pass plus the largest recomputed run."""
    inside = {k for a, b in runs for k in range(a, b)}
    kept = sum(c.saved_bytes for k, c in enumerate(costs) if k not in inside)
    kept += sum(costs[a].input_bytes for a, _ in runs)
    recompute = max((sum(c.saved_bytes for c in costs[a:b]) for a, b in runs), default=0)
    return kept + recompute + head_bytes


def measure_block_costs(chain: Chain, x: torch.Tensor, *, compress: bool,
                        exclude: Sequence[torch.Tensor]) -> tuple[list[BlockCost], int]:
    """Each block's cost and the bytes the exit heads save, measured on ``x``."""
    costs: list[BlockCost] = []
    head_bytes = 0
    h = x
    with torch.enable_grad():
        for segment, head in zip(chain.segments, chain.heads, strict=True):
            for block in segment:
                with _frozen_running_stats(block), Int8SavedTensors(exclude, compress=compress) as counter:
                    out = block(h)
                kept_input = h.numel() * (1 if compress and h.numel() >= MIN_COMPRESS_NUMEL else h.element_size())
                costs.append(BlockCost(counter.saved_bytes, counter.raw_bytes, kept_input))
                # Cut the graph here: keeping it would hold every block's saved activations until
                # the end of planning (as much as plain autograd's peak). The next block still sees
                # an input that requires grad, as in the chain.
                h = out.detach().requires_grad_(out.requires_grad)
                del out
            if head is not None:
                with _frozen_running_stats(head), Int8SavedTensors(exclude, compress=compress) as counter:
                    head(h)
                head_bytes += counter.saved_bytes
    return costs, head_bytes


def _split(first: int, last: int, parts: int, boundaries: set[int]) -> Runs:
    """``parts`` runs of about equal length over blocks first..last-1, cut at exits."""
    bounds = sorted({first, last, *[b for b in boundaries if first < b < last]})
    runs: list[tuple[int, int]] = []
    for a, b in itertools.pairwise(bounds):
        share = max(1, round(parts * (b - a) / (last - first)))
        edges = [a + round(i * (b - a) / share) for i in range(share + 1)]
        runs.extend((p, q) for p, q in itertools.pairwise(edges) if q > p)
    return tuple(runs)


def plan_checkpoints(chain: Chain, x: torch.Tensor, budget_bytes: int | None, *, compress: bool,
                     exclude: Sequence[torch.Tensor]) -> CheckpointPlan:
    """The least recomputation that fits ``budget_bytes`` (None: no recomputation).

    Early blocks hold the largest feature maps, so recomputation covers a prefix of the
    chain, cut into runs (one input kept per run, one run recomputed at a time); the
    shortest prefix that fits wins, and for it the run count with the lowest estimate.
    BudgetError when even recomputing every block is over the budget.
    """
    costs, head_bytes = measure_block_costs(chain, x, compress=compress, exclude=exclude)
    plain = estimate_bytes(costs, (), head_bytes)
    best: tuple[int, Runs] = (plain, ())
    if budget_bytes is not None and plain > budget_bytes:
        boundaries = set(np.cumsum([len(s) for s in chain.segments]).tolist())
        best = (plain, ())
        for prefix in range(1, len(costs) + 1):
            options = [_split(0, prefix, parts, boundaries) for parts in range(1, prefix + 1)]
            scored = min((estimate_bytes(costs, runs, head_bytes), runs) for runs in options)
            best = min(best, scored)
            if scored[0] <= budget_bytes:
                best = scored
                break
        if best[0] > budget_bytes:
            raise BudgetError(
                f"activation memory budget {budget_bytes / 2**20:.2f} MiB is below the "
                f"{best[0] / 2**20:.2f} MiB this batch of {x.shape[0]} needs even with recomputation; "
                "raise the budget or lower the batch size")
    return CheckpointPlan(best[1], tuple(costs), head_bytes, best[0], plain, budget_bytes)
