import os, sys, json, torch
sys.path.insert(0, os.getcwd())
import ostinato
from ostinato.backends.cuda import library_ops as L
from bench.suite import configs, measure, workloads
res = {}
name = sys.argv[1]
cfg = configs.select("cuda", name)[0]
wl = workloads.build(cfg.builder, cfg.params, cfg.device, cfg.dtype)
step = wl.steps[0]
ref = measure.call(wl.model, step)
ref1 = measure.call(wl.model, wl.steps[1])
prog = ostinato.export(wl.model, *step, **wl.export_options)
orig = L._prepared_weight
def variant(tag, env, fresh_weights=False, skip_first=False):
    os.environ.update(env)
    L._prepared_weight = (lambda w, fmt: w.contiguous(memory_format=fmt)) if fresh_weights else orig
    exe = ostinato.compile(prog, device="cuda", replay=True)
    errs = [measure.max_error(measure.call(exe, st), r) for st, r in ((step, ref), (wl.steps[1], ref1), (step, ref))]
    res[tag] = errs
    print(tag, errs, flush=True)
variant("auto_f1", {"OSTINATO_CONV_LAYOUT": "auto", "OSTINATO_FUSION": "1"})
import sys as _s
if len(_s.argv) > 2: raise SystemExit(0)
variant("auto_f0", {"OSTINATO_CONV_LAYOUT": "auto", "OSTINATO_FUSION": "0"})
variant("auto_f1_freshw", {"OSTINATO_CONV_LAYOUT": "auto", "OSTINATO_FUSION": "1"}, fresh_weights=True)
variant("nchw_f1", {"OSTINATO_CONV_LAYOUT": "nchw", "OSTINATO_FUSION": "1"})
# step mode for comparison
os.environ.update({"OSTINATO_CONV_LAYOUT": "auto", "OSTINATO_FUSION": "1"})
exe = ostinato.compile(prog, device="cuda")
res["step"] = measure.max_error(measure.call(exe, step), ref)
# eager under a CUDA graph with channels-last
m2 = wl.model.to(memory_format=torch.channels_last)
x = step[0][0].clone()
s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s), torch.no_grad():
    for _ in range(3): m2(x.contiguous(memory_format=torch.channels_last))
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g), torch.no_grad():
    o = m2(x.contiguous(memory_format=torch.channels_last))
g.replay(); torch.cuda.synchronize()
res["eager_cl_graph"] = measure.max_error(o, ref)
print(res, flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "debug.json"), "w"), indent=1)
