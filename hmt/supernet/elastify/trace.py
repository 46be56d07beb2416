"""Tracing a user model with torch.fx, and refusing what cannot be traced in one clear line.

A refusal names the module being traced when tracing broke, the line of the user's code
that broke it, and the way out (``--leaf MODULE_PATH`` keeps that module as one opaque,
unchanged block). In-place operations on a tensor that something else still reads would
make the split graph differ from the original and are refused the same way.
"""

from __future__ import annotations

import copy
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp
from torch.nn.parameter import UninitializedBuffer, UninitializedParameter

from hmt.errors import ModelError

# Tensor methods whose trailing underscore means "in place" but which have a pure twin.
_TORCH_DIR = str(Path(torch.__file__).parent)


class _Tracer(fx.Tracer):
    """Records the module path being traced (for refusals) and treats ``leaves`` as opaque."""

    def __init__(self, leaves: Sequence[str]) -> None:
        super().__init__()
        self.record_stack_traces = True
        self.leaves = set(leaves)
        self.path_stack: list[str] = []
        self.failed_path: str | None = None  # the innermost module being traced when tracing broke

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return module_qualified_name in self.leaves or super().is_leaf_module(m, module_qualified_name)

    def call_module(self, m: nn.Module, forward: Any, args: Any, kwargs: Any) -> Any:
        self.path_stack.append(self.path_of_module(m))
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception:
            if self.failed_path is None:
                self.failed_path = self.path_stack[-1]
            raise
        finally:
            self.path_stack.pop()


def _user_frame(exc: BaseException) -> str:
    """``file:line`` of the innermost frame outside torch (the user's code that broke tracing)."""
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        if not frame.filename.startswith(_TORCH_DIR) and "/hmt/supernet/elastify/" not in frame.filename:
            return f"{frame.filename}:{frame.lineno}"
    return "unknown location"


def _why(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "control flow" in text or "iterate" in text or "len(" in text:
        return "uses a traced tensor in Python control flow (data-dependent if/for/len)"
    if isinstance(exc, CustomAutogradFunction):
        return f"calls a {text}"
    return f"{type(exc).__name__}: {text[:200]}"


class CustomAutogradFunction(RuntimeError):
    pass


@contextmanager
def _refusing_autograd_functions() -> Iterator[None]:
    """torch.fx traces through ``Function.apply`` into its forward and silently drops the
    custom backward; refuse instead, so the module can be kept whole with --leaf."""
    original = torch.autograd.Function.__dict__["apply"]

    def apply(cls: type, *args: Any, **kwargs: Any) -> Any:
        if any(isinstance(a, fx.Proxy) for a in (*args, *kwargs.values())):
            raise CustomAutogradFunction(f"custom autograd Function {cls.__name__} (its backward would be lost)")
        return original.__func__(cls, *args, **kwargs)

    torch.autograd.Function.apply = classmethod(apply)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.autograd.Function.apply = original  # type: ignore[method-assign]


def copy_of(model: nn.Module) -> nn.Module:
    """``copy.deepcopy(model)``; a ModelError in one line where the model cannot be copied
    (elastification copies it: the check here, the supernet, its alternatives)."""
    refuse_unsupported(model)
    try:
        return copy.deepcopy(model)
    except Exception as exc:
        text = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise ModelError(f"cannot elastify: the model cannot be copied (copy.deepcopy raised {type(exc).__name__}: "
                         f"{text}); hmt copies it to build the supernet") from exc


def refuse_unsupported(model: nn.Module) -> None:
    """Models torch.fx cannot trace or hmt cannot copy, refused saying what to change:
    TorchScript, lazy layers not yet run, the deprecated hook-based weight norm."""
    if isinstance(model, torch.jit.ScriptModule):
        raise ModelError("cannot elastify a TorchScript module (torch.jit.script or trace): torch.fx traces the "
                         "Python code; return the nn.Module itself from the factory")
    lazy = [name for name, t in (*model.named_parameters(), *model.named_buffers())
            if isinstance(t, UninitializedParameter | UninitializedBuffer)]
    if lazy:
        shown = ", ".join(lazy[:3]) + (f" and {len(lazy) - 3} more" if len(lazy) > 3 else "")
        raise ModelError(f"cannot elastify: the model has uninitialized lazy parameters ({shown}); run it once on an "
                         "example input in the factory (model(torch.zeros(...))) so their shapes are set")
    for name, module in model.named_modules():
        if any(type(hook).__name__ == "WeightNorm" for hook in module._forward_pre_hooks.values()):
            raise ModelError(f"cannot elastify: module {name!r} uses torch.nn.utils.weight_norm (deprecated: its hook "
                             "cannot be copied); use torch.nn.utils.parametrizations.weight_norm, or "
                             "fold it into the weight with torch.nn.utils.remove_weight_norm")


def trace_model(model: nn.Module, leaves: Sequence[str] = ()) -> fx.GraphModule:
    """Symbolically trace ``model`` (in eval mode) into a GraphModule; ModelError on failure."""
    refuse_unsupported(model)
    known = {name for name, _ in model.named_modules()}
    unknown = [leaf for leaf in leaves if leaf not in known]
    if unknown:
        raise ModelError(f"--leaf {unknown[0]!r}: the model has no submodule of that path (see model.named_modules())")
    model.eval()
    tracer = _Tracer(leaves)
    defaults = _defaults_after_input(model)
    try:
        with _refusing_autograd_functions():
            graph = tracer.trace(model, concrete_args=defaults or None)
    except Exception as exc:
        path = tracer.failed_path or ""
        where = _user_frame(exc)
        module_text = (
            f"module {path!r} ({type(model.get_submodule(path)).__name__})" if path else "the top-level forward"
        )
        way_out = (
            f"keep it as one unchanged block with --leaf {path}"
            if path
            else "move that code into a submodule and pass its path to --leaf"
        )
        raise ModelError(f"cannot elastify: {module_text} at {where} {_why(exc)}; {way_out}") from exc
    _drop_bound_arguments(graph)
    gm = fx.GraphModule(tracer.root, graph, type(model).__name__)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        raise ModelError(f"cannot elastify: forward() takes {len(placeholders)} inputs, expected exactly one tensor")
    _refuse_unsafe_inplace(gm)
    _remove_inplace(gm)
    return gm


def _defaults_after_input(model: nn.Module) -> dict[str, Any]:
    """The forward's arguments after the input that have defaults (``return_features=False``):
    traced at those values, as the rest of hmt calls the model with the input alone."""
    import inspect

    try:
        parameters = list(inspect.signature(model.forward).parameters.values())[1:]
    except (TypeError, ValueError):
        return {}
    return {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


# What fx adds for an argument bound to a value: a check that a call passes that value.
_BOUND_CHECKS = ("eq", "_assert", "_assert_is_none")


def _drop_bound_arguments(graph: fx.Graph) -> None:
    """Remove the placeholders of arguments traced at their defaults, with fx's checks of them,
    so the graph takes the input alone."""
    for placeholder in [n for n in graph.nodes if n.op == "placeholder"][1:]:
        chain, frontier = [], [placeholder]
        while frontier:
            node = frontier.pop(0)
            if node not in chain:
                chain.append(node)
                frontier.extend(node.users)
        if all(getattr(n.target, "__name__", None) in _BOUND_CHECKS for n in chain[1:]):
            for node in reversed(chain):
                graph.erase_node(node)


_INPLACE_FUNCTIONS = {"relu_", "sigmoid_", "tanh_", "add_", "mul_", "clamp_", "hardtanh_", "copy_", "zero_", "fill_"}


def _node_module_path(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if stack:
        last = list(stack.values())[-1]
        return str(last[0] if isinstance(last, tuple) else last)
    return ""


def _refuse_unsafe_inplace(gm: fx.GraphModule) -> None:
    """An in-place op whose input is read by another node changes what that node sees;
    splitting the graph into blocks would then change results. Refuse naming where."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    for node in gm.graph.nodes:
        target = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
        inplace = node.op in ("call_method", "call_function") and (
            target in _INPLACE_FUNCTIONS or (target.endswith("_") and not target.startswith("_"))
        )
        if node.op == "call_function" and node.kwargs.get("inplace") is True:
            inplace = True
        if not inplace or not node.args or not isinstance(node.args[0], fx.Node):
            continue
        mutated = node.args[0]
        later_readers = [u for u in mutated.users if u is not node and order[u] > order[node]]
        if later_readers:
            where = (node.stack_trace or "").strip().splitlines()
            location = where[-2].strip() if len(where) >= 2 else "unknown location"
            path = _node_module_path(node)
            raise ModelError(
                f"cannot elastify: in-place {target} in module {path or '<top level>'!r} ({location}) changes a tensor "
                f"that {later_readers[0].name} reads later; make it out-of-place, or keep the module whole with "
                f"--leaf {path or 'MODULE_PATH'}"
            )


def _remove_inplace(gm: fx.GraphModule) -> None:
    """Make every in-place op out-of-place (same numbers, since no other node reads the
    mutated tensor): a block's input may then be fed to several alternatives and to an
    exit without being changed under them."""
    for module in gm.modules():
        if getattr(module, "inplace", False) is True:
            setattr(module, "inplace", False)  # noqa: B010 - any module type with the flag
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.kwargs.get("inplace") is True:
            node.kwargs = {**node.kwargs, "inplace": False}
        elif node.op == "call_method" and node.target.endswith("_") and not node.target.startswith("_"):
            if hasattr(torch.Tensor, node.target[:-1]):
                node.target = node.target[:-1]
        elif node.op == "call_function":
            name = getattr(node.target, "__name__", "")
            if name.endswith("_") and not name.startswith("_") and hasattr(torch, name[:-1]):
                node.target = getattr(torch, name[:-1])
    gm.recompile()


def propagate_shapes(gm: fx.GraphModule, example: torch.Tensor) -> None:
    """Record every node's output shape in ``node.meta['tensor_meta']`` (eval mode, no grad)."""
    gm.eval()
    try:
        with torch.no_grad():
            ShapeProp(gm).propagate(example)
    except Exception as exc:
        raise ModelError(
            f"cannot elastify: the traced model fails on an input of shape {tuple(example.shape)} "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); check --input-shape"
        ) from exc


def output_shape(node: fx.Node) -> tuple[int, ...] | None:
    meta = node.meta.get("tensor_meta")
    shape = getattr(meta, "shape", None)
    return tuple(int(d) for d in shape) if shape is not None else None
