# ruff: noqa
"""Probe ORT per-call options on a fused variant chain (one-off measurements behind burst/chain_overhead_probe.txt).

Usage: python benchmarks/convert_fuse/probe_ort_options.py CONVERTED_DIR FUSED_DIR
(artifacts from scripts/bench_fuse.py --work-dir; env REP=samples, BURST=calls per visit).
"""
import json, os, sys, time
import numpy as np, onnx, onnxruntime as ort
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
from hmt.fuse.engines.timing import measure_alternating

conv = sys.argv[1]
fused = sys.argv[2]
rep = json.load(open(f"{fused}/report.json"))["variants"][0]
path = rep["timed_path"]
graphs = {g["file"]: g for g in rep["graphs"]}
conv_files = [f"{conv}/{f}" for f in path]
fused_files = [f"{fused}/{graphs[f]['onnx']['file']}" for f in path]
names = [graphs[f]["input_name"] for f in path]
m0 = onnx.load(conv_files[0])
shape = [d.dim_value for d in m0.graph.input[0].type.tensor_type.shape.dim]
x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)

def opts(threads=0, spin=True, level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL, daz=False, arena=True, mem_pattern=True, extra=()):
    o = ort.SessionOptions(); o.graph_optimization_level = level; o.intra_op_num_threads = threads
    o.log_severity_level = 3
    if not spin: o.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if daz: o.add_session_config_entry("session.set_denormal_as_zero", "1")
    o.enable_cpu_mem_arena = arena; o.enable_mem_pattern = mem_pattern
    for k, v in extra: o.add_session_config_entry(k, v)
    return o

def plain(files, o):
    ss = [ort.InferenceSession(f, o, providers=["CPUExecutionProvider"]) for f in files]
    def run():
        h = ss[0].run(None, {names[0]: x})[0]
        for s, n in zip(ss[1:], names[1:]):
            h = s.run(None, {n: h})[0]
        return h
    return run

def ortvalues(files, o):
    ss = [ort.InferenceSession(f, o, providers=["CPUExecutionProvider"]) for f in files]
    outs = [[s.get_outputs()[0].name] for s in ss]
    xv = ort.OrtValue.ortvalue_from_numpy(x)
    def run():
        h = xv
        for s, n, on in zip(ss, names, outs):
            h = s.run_with_ort_values(on, {n: h})[0]
        return h.numpy()
    return run

def iobind(files, o):
    ss = [ort.InferenceSession(f, o, providers=["CPUExecutionProvider"]) for f in files]
    # preallocate every output, bind chain
    xv = ort.OrtValue.ortvalue_from_numpy(x)
    cur = xv; binds = []
    for s, n in zip(ss, names):
        b = s.io_binding()
        b.bind_ortvalue_input(n, cur)
        o_ = s.get_outputs()[0]
        # run once to learn output shape
        shp = s.run(None, {n: cur.numpy()})[0].shape
        ov = ort.OrtValue.ortvalue_from_shape_and_type(list(shp), np.float32)
        b.bind_ortvalue_output(o_.name, ov)
        binds.append((s, b)); cur = ov
    ro = ort.RunOptions()
    def run():
        for s, b in binds:
            s.run_with_iobinding(b, ro)
        return cur.numpy()
    return run

def _merged_session(files, o):
    from hmt.fuse.engines.ort import merge_chain

    s = ort.InferenceSession(merge_chain([onnx.load(f) for f in files]).SerializeToString(), o,
                             providers=["CPUExecutionProvider"])
    return s, s.get_inputs()[0].name

def merged(files, o):
    s, n = _merged_session(files, o)
    return lambda: s.run(None, {n: x})[0]

def merged_io(files, o):
    s, n = _merged_session(files, o)
    shp = s.run(None, {n: x})[0].shape
    b = s.io_binding(); b.bind_ortvalue_input(n, ort.OrtValue.ortvalue_from_numpy(x))
    ov = ort.OrtValue.ortvalue_from_shape_and_type(list(shp), np.float32); b.bind_ortvalue_output(s.get_outputs()[0].name, ov)
    def run():
        s.run_with_iobinding(b); return ov.numpy()
    return run

which = sys.argv[3] if len(sys.argv) > 3 else "all"
c = {
 "default(conv)": plain(conv_files, opts()),
 "default(fused)": plain(fused_files, opts()),
 "t1(fused)": plain(fused_files, opts(1)),
 "t1nospin(fused)": plain(fused_files, opts(1, False)),
 "t2nospin(fused)": plain(fused_files, opts(0, False)),
 "t1,daz": plain(fused_files, opts(1, daz=True)),
 "t1,noarena": plain(fused_files, opts(1, arena=False, mem_pattern=False)),
 "t1,ortvalues": ortvalues(fused_files, opts(1)),
 "t1,iobind": iobind(fused_files, opts(1)),
 "def,iobind": iobind(fused_files, opts()),
 "t1,merged": merged(fused_files, opts(1)),
 "t1,merged,io": merged_io(fused_files, opts(1)),
 "def,merged,io": merged_io(fused_files, opts()),
 "t1,extended": plain(fused_files, opts(1, level=ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED)),
}
ref = c["default(conv)"]()
for k, f in c.items():
    np.testing.assert_allclose(np.asarray(f()), ref, atol=1e-4, rtol=1e-3)
la = os.getloadavg()[0]
T = measure_alternating(c, warmup=5, repeats=int(os.environ.get("REP", 200)), burst=int(os.environ.get("BURST", 10)))
base = T["default(conv)"].median_ms
print(f"{conv} load {la:.2f}->{os.getloadavg()[0]:.2f}")
for k, t in sorted(T.items(), key=lambda kv: kv[1].median_ms):
    print(f"  {k:18s} med {t.median_ms*1e3:7.1f}us min {t.min_ms*1e3:7.1f} p90 {t.percentile_ms(.9)*1e3:7.1f} cold {t.cold_median_ms*1e3:7.1f}  x{base/t.median_ms:.2f}")
