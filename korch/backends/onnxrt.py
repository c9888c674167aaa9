"""The ONNX Runtime backend: a candidate written back as an ONNX model (primitives map to ONNX
operators) and run as a session (on CPU through run() on zero-copy numpy views, on CUDA with IO
binding), so ONNX Runtime's own fused kernels and its MLAS matmul become candidates too. The source
model run whole is one such kernel, its bytes handed to ONNX Runtime as they are."""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

from korch.backends import Backend, CompiledKernel, Weights, onnx_patterns, onnx_view, source_digest
from korch.backends.onnx_patterns import fuse, split_groups
from korch.frontend.onnx.tensor_types import to_onnx_dtype
from korch.ir.graph import Graph, Node
from korch.ir.prims import Kind, Prim
from korch.search.kernel import KernelSpec, runs_alone

OPSET = 18


class _Writer:
    """Accumulates ONNX nodes and initializers for one kernel graph."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.alias: dict[str, str] = {}
        self.elide = _elidable_broadcasts(graph)  # broadcasts left to ONNX's implicit broadcasting

    def name(self, v: str) -> str:
        return self.alias.get(v, v)

    def const(self, array, hint: str) -> str:
        name = f"{hint}_{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def add(self, op: str, inputs, outputs, **attrs) -> None:
        self.nodes.append(helper.make_node(op, list(inputs), list(outputs), **attrs))


def _elidable_broadcasts(graph: Graph) -> set[str]:
    """Broadcast outputs read only by elementwise primitives that have another operand of the
    full shape: ONNX broadcasts implicitly there (a unary reader would keep the small shape)."""
    readers = graph.consumers()
    broadcasts = {n.outputs[0] for n in graph.nodes if n.prim is Prim.BROADCAST}

    def restored(reader, v: str) -> bool:
        full = graph.types[reader.outputs[0]].shape
        return any(u != v and u not in broadcasts and graph.types[u].shape == full for u in reader.inputs)

    return {
        v
        for v in broadcasts
        if v not in graph.outputs
        and all(r.kind is Kind.ELEMENTWISE and restored(r, v) for r in readers.get(v, []))
    }


Emitter = Callable[[_Writer, Node, list[str], str], None]  # (writer, node, input names, output name)


def _op(op_type: str, *copied: str, **fixed) -> Emitter:
    """One ONNX operator on the primitive's operands: the primitive's attributes named in `copied`
    (sequences as lists) and `fixed` ones."""

    def emit(w: _Writer, node: Node, ins: list[str], out: str) -> None:
        attrs = {k: list(node.a[k]) if isinstance(node.a[k], (tuple, list)) else node.a[k] for k in copied}
        w.add(op_type, ins, [out], **attrs, **fixed)

    return emit


def _int64s(w: _Writer, values, hint: str) -> str:
    return w.const(np.array(values, "int64"), hint)


def _reduce(op_type: str) -> Emitter:
    def emit(w: _Writer, node: Node, ins: list[str], out: str) -> None:
        w.add(op_type, [ins[0], _int64s(w, node.a["axes"], "axes")], [out], keepdims=1)

    return emit


def _shaped(op_type: str) -> Emitter:
    """An operator taking the primitive's shape attribute as its second operand."""

    def emit(w: _Writer, node: Node, ins: list[str], out: str) -> None:
        w.add(op_type, [ins[0], _int64s(w, node.a["shape"], "shape")], [out])

    return emit


_expand = _shaped("Expand")


def _broadcast(w: _Writer, node: Node, ins: list[str], out: str) -> None:
    if out in w.elide:
        w.alias[out] = ins[0]
    else:
        _expand(w, node, ins, out)


def _slice(w: _Writer, node: Node, ins: list[str], out: str) -> None:
    a, dims = node.a, w.graph.types[node.inputs[0]].shape
    ends = []
    for dim, start, step, size in zip(dims, a["starts"], a["steps"], a["sizes"]):
        end = start + (size - 1) * step + (1 if step > 0 else -1) if size else start
        ends.append(end if end >= 0 else -(dim + 1))  # a negative end would count from the back
    arrays = [a["starts"], ends, list(range(len(dims))), a["steps"]]
    w.add("Slice", [ins[0], *(_int64s(w, x, "slice") for x in arrays)], [out])


def _pad(w: _Writer, node: Node, ins: list[str], out: str) -> None:
    value = w.const(np.array(node.a["value"], w.graph.types[node.inputs[0]].dtype), "value")
    w.add("Pad", [ins[0], _int64s(w, node.a["pads"], "pads"), value], [out], mode=node.a["mode"])


def _scatter(w: _Writer, node: Node, ins: list[str], out: str) -> None:
    index = f"{out}_index"
    w.add("Cast", [ins[1]], [f"{out}_long"], to=onnx.TensorProto.INT64)
    w.add("Reshape", [f"{out}_long", _int64s(w, [-1, 1], "rows")], [index])
    w.add("ScatterND", [ins[0], index, ins[2]], [out], reduction=node.a["reduction"])


def _argsort(w: _Writer, node: Node, ins: list[str], out: str) -> None:
    axis = node.a["axis"]
    k = _int64s(w, [w.graph.types[out].shape[axis]], "k")
    largest = int(node.a["descending"])
    w.add("TopK", [ins[0], k], [f"{out}_values", out], axis=axis, largest=largest, sorted=1)


_CONV = ("strides", "pads", "dilations", "group")

# each primitive as ONNX operators (opset OPSET). None for WINDOW (ONNX has it only inside a pool,
# which onnx_patterns fuses), GROUPED_MATMUL (no ONNX equivalent) and OPAQUE (its own model, to_onnx)
EMITTERS: dict[Prim, Emitter] = {
    Prim.NEG: _op("Neg"),
    Prim.ABS: _op("Abs"),
    Prim.EXP: _op("Exp"),
    Prim.LOG: _op("Log"),
    Prim.SQRT: _op("Sqrt"),
    Prim.RECIPROCAL: _op("Reciprocal"),
    Prim.ERF: _op("Erf"),
    Prim.TANH: _op("Tanh"),
    Prim.SIGMOID: _op("Sigmoid"),
    Prim.FLOOR: _op("Floor"),
    Prim.CEIL: _op("Ceil"),
    Prim.ROUND: _op("Round"),
    Prim.SIN: _op("Sin"),
    Prim.COS: _op("Cos"),
    Prim.ATAN: _op("Atan"),
    Prim.SIGN: _op("Sign"),
    Prim.NOT: _op("Not"),
    Prim.CAST: lambda w, node, ins, out: w.add("Cast", ins, [out], to=to_onnx_dtype(node.a["to"])),
    Prim.ADD: _op("Add"),
    Prim.SUB: _op("Sub"),
    Prim.MUL: _op("Mul"),
    Prim.DIV: _op("Div"),
    Prim.POW: _op("Pow"),
    Prim.MAX: _op("Max"),
    Prim.MIN: _op("Min"),
    Prim.EQ: _op("Equal"),
    Prim.LT: _op("Less"),
    Prim.GT: _op("Greater"),
    Prim.AND: _op("And"),
    Prim.OR: _op("Or"),
    Prim.XOR: _op("Xor"),
    Prim.WHERE: _op("Where"),
    Prim.BROADCAST: _broadcast,
    Prim.REDUCE_SUM: _reduce("ReduceSum"),
    Prim.REDUCE_MAX: _reduce("ReduceMax"),
    Prim.REDUCE_MIN: _reduce("ReduceMin"),
    Prim.REDUCE_PROD: _reduce("ReduceProd"),
    Prim.ARGMAX: _op("ArgMax", "axis", keepdims=1),
    Prim.ARGMIN: _op("ArgMin", "axis", keepdims=1),
    Prim.ARGSORT: _argsort,
    Prim.RESHAPE: _shaped("Reshape"),
    Prim.TRANSPOSE: _op("Transpose", "perm"),
    Prim.SLICE: _slice,
    Prim.CONCAT: _op("Concat", "axis"),
    Prim.PAD: _pad,
    Prim.GATHER: _op("Gather", "axis"),
    Prim.SCATTER: _scatter,
    Prim.MATMUL: _op("MatMul"),
    Prim.CONV: _op("Conv", *_CONV),
    Prim.CONV_TRANSPOSE: _op("ConvTranspose", *_CONV, "output_padding"),
}


def _emit(w: _Writer, node: Node) -> None:
    emitter = EMITTERS.get(node.prim)
    if emitter is None:
        raise NotImplementedError(f"{node.prim.value} has no ONNX equivalent")
    emitter(w, node, [w.name(v) for v in node.inputs], node.outputs[0])


def to_onnx(graph: Graph, weights: Weights | None = None, patterns=None) -> onnx.ModelProto:
    """The kernel graph as an ONNX model (opset 18); an opaque primitive is its own model already.
    `weights` (values of some inputs) become initializers: ONNX Runtime then prepacks them, and
    turns convolutions with constant weights (and only those) into its NCHWc kernels. `patterns`:
    the primitive patterns written back as ONNX operators (korch.backends.onnx_patterns; None:
    its PATTERNS)."""
    weights = weights or {}
    if len(graph.nodes) == 1 and graph.nodes[0].prim is Prim.OPAQUE:
        if source_model(graph) is None:
            return _opaque_model(graph, weights)
        # the source model run whole, with its outputs renamed (compile() runs its bytes as they are)
        model = onnx.load_from_string(graph.nodes[0].a["model"])
        produced = [o.name for o in model.graph.output]
        model.graph.ClearField("output")
        for name, produced_name, v in zip(graph.output_names, produced, graph.nodes[0].outputs):
            if produced_name != name:
                model.graph.node.append(helper.make_node("Identity", [produced_name], [name]))
            t = graph.types[v]
            model.graph.output.append(helper.make_tensor_value_info(name, to_onnx_dtype(t.dtype), t.shape))
        return model
    w = _Writer(graph)
    for name, array in [*graph.constants.items(), *weights.items()]:
        w.inits.append(numpy_helper.from_array(np.asarray(array), name))
    fused = fuse(graph, weights, patterns)
    splits = split_groups(graph)
    absorbed = set().union(*(f.absorbed for f in fused.values()), *(s.absorbed for s in splits.values()))
    for i, node in enumerate(graph.nodes):
        if i in fused:
            f = fused[i]
            ins = [w.const(v, "fused") if isinstance(v, np.ndarray) else w.name(v) for v in f.inputs]
            w.add(f.op, ins, [node.outputs[0]], **f.attrs)
        elif i in splits:
            s = splits[i]
            sizes = w.const(np.array(s.sizes, "int64"), "split")
            w.add("Split", [w.name(s.input), sizes], s.outputs, axis=s.axis)
        elif i not in absorbed:
            _emit(w, node)
    for v, name in zip(graph.outputs, graph.output_names):
        w.add("Identity", [w.name(v)], [name])
    used = {v for n in w.nodes for v in n.input}  # a fused pattern's scalars are read no more
    w.inits = [t for t in w.inits if t.name in used]

    def info(name, v):
        t = graph.types[v]
        return helper.make_tensor_value_info(name, to_onnx_dtype(t.dtype), list(t.shape))

    model = helper.make_model(
        helper.make_graph(
            w.nodes,
            graph.name,
            [info(v, v) for v in graph.inputs if v not in weights],
            [info(n, v) for v, n in zip(graph.outputs, graph.output_names)],
            w.inits,
        ),
        opset_imports=[helper.make_opsetid("", OPSET)],
    )
    model.ir_version = 9
    return model


def _opaque_model(graph: Graph, weights: Weights) -> onnx.ModelProto:
    """An opaque primitive's embedded one-operator model, renamed into the kernel's namespace: its
    inputs (by position, the primitive's inputs) become the kernel's input names, or initializers
    where the kernel bakes the value in (a constant such as TopK's k, or a weight), and its outputs
    the kernel's output names. The embedded names are the source model's, so all are replaced."""
    node = graph.nodes[0]
    model = onnx.load_from_string(node.a["model"])
    if len(model.graph.input) != len(node.inputs):
        raise ValueError(f"opaque {node.a['op_type']}: the model's inputs are not the primitive's")
    rename: dict[str, str] = {}
    fed, inits = [], []
    for info, v in zip(model.graph.input, node.inputs):
        rename[info.name] = v
        value = graph.constants.get(v, weights.get(v))
        if value is not None:
            if v not in {i.name for i in inits}:  # (an input taken twice: one initializer)
                inits.append(numpy_helper.from_array(np.asarray(value), v))
        elif v not in fed:
            fed.append(v)
    produced = [o.name for o in model.graph.output] or [o for o in model.graph.node[0].output if o]
    first = {v: name for v, name in reversed(list(zip(graph.outputs, graph.output_names)))}
    for name, v in zip(produced, node.outputs):
        rename[name] = first.get(v, v)  # straight to the kernel's output name where it is one
    for n in model.graph.node:
        n.input[:] = [rename.get(x, x) for x in n.input]
        n.output[:] = [rename.get(x, x) for x in n.output]
    extra = [
        helper.make_node("Identity", [rename[produced[node.outputs.index(v)]]], [name])
        for v, name in zip(graph.outputs, graph.output_names)
        if first[v] != name
    ]
    model.graph.node.extend(extra)

    def info(name, v):
        t = graph.types[v]
        return helper.make_tensor_value_info(name, to_onnx_dtype(t.dtype), list(t.shape))

    model.graph.ClearField("input")
    model.graph.input.extend(info(v, v) for v in fed)
    model.graph.initializer.extend(inits)
    model.ir_version = max(model.ir_version, 4)  # (before 4, an initializer had to be an input too)
    model.graph.ClearField("output")
    model.graph.output.extend(info(name, v) for v, name in zip(graph.outputs, graph.output_names))
    model.graph.ClearField("value_info")
    return model


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"
    bakes_weights = True
    fresh_outputs = True  # (ONNX Runtime returns new arrays, even for an output that is an input)

    def version(self) -> str:
        import onnxruntime

        digest = source_digest(sys.modules[__name__], onnx_patterns, onnx_view)
        return f"onnxruntime-{onnxruntime.__version__}+{digest}"

    def supports(self, spec: KernelSpec, device: str) -> str | None:
        nodes = spec.graph.nodes
        if len(nodes) > 1 and any(n.prim is Prim.OPAQUE for n in nodes):
            return "an opaque operator runs alone (its one-operator model has an opset of its own)"
        if unfused_window(spec.graph):
            return "window outside a pool has no ONNX equivalent"
        if any(n.prim is Prim.GROUPED_MATMUL for n in nodes):
            return "a grouped matmul has no ONNX equivalent"
        if device == "cpu" and "bfloat16" in spec.graph.dtypes():
            return "ONNX Runtime has no bfloat16 kernels on a CPU"
        if any(
            n.prim in (Prim.CONV, Prim.CONV_TRANSPOSE) and spec.graph.types[n.outputs[0]].dtype == "float64"
            for n in nodes
        ):
            return "ONNX Runtime has no float64 convolution (ConvInteger's exact sums)"
        if device.startswith("cuda"):
            import onnxruntime

            if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
                return "onnxruntime has no CUDA provider here"
        return None

    def compile(self, spec: KernelSpec, device: str, weights: Weights | None = None) -> CompiledKernel:
        import onnxruntime as ort

        graph = spec.graph
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        opts.intra_op_num_threads = torch.get_num_threads()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        source = source_model(graph)
        # a plan holds many sessions, each with its own thread pool: spinning pools would fight;
        # a kernel that is a plan by itself spins, which makes it faster
        opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if runs_alone(spec.key) else "0")
        cuda = device.startswith("cuda")
        providers = ["CUDAExecutionProvider"] if cuda else ["CPUExecutionProvider"]
        if source is not None:  # the bytes as they are: no second copy of a large model
            weights = None  # (it holds its own weights and takes its inputs as they are)
            sess = ort.InferenceSession(source, opts, providers=providers)
            out_names = [o.name for o in sess.get_outputs()]
            nodes = dict(graph.nodes[0].attrs).get("nodes", 1)
        else:
            model = to_onnx(graph, weights)
            sess = ort.InferenceSession(model.SerializeToString(), opts, providers=providers)
            out_names, nodes = list(graph.output_names), len(model.graph.node)
        # the session's inputs, by position among the kernel's (baked weights are not among them)
        fed = [i for i, v in enumerate(graph.inputs) if v not in (weights or {})]
        in_names = [graph.inputs[i] for i in fed]  # (to_onnx keeps the kernel's names)
        if source is not None:
            in_names = [i.name for i in sess.get_inputs()]
        if not cuda:
            # on CPU, plain run() on zero-copy numpy views costs less a call than IO binding
            # (ONNX Runtime re-plans a binding whose buffers changed)
            def run(*inputs: torch.Tensor) -> list[torch.Tensor]:
                feeds = {name: inputs[i].detach().contiguous().numpy() for name, i in zip(in_names, fed)}
                return [torch.from_numpy(y) for y in sess.run(out_names, feeds)]

            def arrays(*inputs: np.ndarray) -> list[np.ndarray]:
                return sess.run(out_names, {name: inputs[i] for name, i in zip(in_names, fed)})

            return CompiledKernel(run, kernels=nodes, arrays=arrays)

        from korch.ir.tensors import DTYPES

        out_types = [graph.types[v] for v in graph.outputs]
        kind, index = "cuda", torch.device(device).index or 0
        binding = sess.io_binding()

        def fn(*inputs: torch.Tensor) -> list[torch.Tensor]:
            outs = [torch.empty(t.shape, dtype=DTYPES[t.dtype], device=device) for t in out_types]
            alive = [inputs[i].contiguous() for i in fed]  # the buffers must outlive the run
            # ONNX Runtime runs on a stream of its own (and returns when it is done): the inputs
            # torch's stream is still computing must be finished first
            torch.cuda.current_stream(device).synchronize()
            for name, x in zip(in_names, alive):
                binding.bind_input(name, kind, index, np.dtype(_np(x)), tuple(x.shape), x.data_ptr())
            for name, y, t in zip(out_names, outs, out_types):
                binding.bind_output(name, kind, index, np.dtype(t.dtype), t.shape, y.data_ptr())
            sess.run_with_iobinding(binding)
            return outs

        return CompiledKernel(fn, kernels=nodes)


def unfused_window(graph: Graph) -> bool:
    windows = {i for i, n in enumerate(graph.nodes) if n.prim is Prim.WINDOW}
    return bool(windows) and bool(windows - set().union(*(f.absorbed for f in fuse(graph).values())))


def source_model(graph: Graph) -> bytes | None:
    """The bytes of a whole source model when the kernel is one (korch.pipeline.original_model_seed)."""
    if len(graph.nodes) == 1 and graph.nodes[0].prim is Prim.OPAQUE:
        attrs = dict(graph.nodes[0].attrs)
        if attrs.get("op_type") == "model":
            return attrs["model"]
    return None


def _np(x: torch.Tensor) -> str:
    return str(x.dtype).replace("torch.", "")
