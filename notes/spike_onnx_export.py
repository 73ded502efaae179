import sys, time, warnings, io
sys.path.insert(0, "/work/wip6")
import torch, numpy as np, onnxruntime as ort
from ppdist.config import load_config
from ppdist.builder import build_model
from ppdist.modeling.deploy import convert_to_deploy
warnings.filterwarnings("ignore")

class Seg(torch.nn.Module):
    def __init__(s, m): super().__init__(); s.m = m
    def forward(s, x): return s.m(x)[0] if isinstance(s.m(x), list) else s.m(x)
class Det(torch.nn.Module):
    def __init__(s, m): super().__init__(); s.m = m
    def forward(s, x):
        out = s.m(x); return out["boxes"], out["scores"]
class Rec(torch.nn.Module):
    def __init__(s, m): super().__init__(); s.m = m
    def forward(s, x): return s.m(x)

cases_all = [("rec", "configs/rec/quickstart_synth.yml", ["Architecture.Neck.encoder_type=rnn"], Rec, [(1,3,32,100),(3,3,32,320)], {0:"n",3:"w"}),
         ("seg", "configs/seg/quickstart_synth.yml", [], Seg, [(1,3,128,128),(2,3,96,160)], {0:"n",2:"h",3:"w"}),
         ("det", "configs/det/quickstart_synth.yml", [], Det, [(1,3,320,320),(2,3,256,384)], {0:"n",2:"h",3:"w"})]
cases = [c for c in cases_all if c[0] in sys.argv[1:]]
for name, cfg, ov, W, shapes, axes in cases:
    config = load_config(cfg, ov)
    model = build_model(config).eval(); convert_to_deploy(model)
    wrapped = W(model).eval()
    for dynamo in (False,):
        buf = io.BytesIO() if not dynamo else "/tmp/spike_%s.onnx" % name
        x = torch.randn(*shapes[0])
        t = time.time()
        try:
            if dynamo:
                dyn = {"x": {k: torch.export.Dim(v, min=1 if v=="n" else 32, max=4096) for k, v in axes.items()}}
                prog = torch.onnx.export(wrapped, (x,), dynamo=True, dynamic_shapes=dyn, opset_version=18)
                prog.save(buf); path = buf
                sess = ort.InferenceSession(path)
            else:
                torch.onnx.export(wrapped, (x,), buf, opset_version=17, dynamo=False, input_names=["x"],
                                  dynamic_axes={"x": axes})
                sess = ort.InferenceSession(buf.getvalue())
        except Exception as e:
            print(name, "dynamo" if dynamo else "legacy", "EXPORT FAIL", type(e).__name__, str(e)[:300]); continue
        diffs = []
        for sh in shapes:
            x = torch.randn(*sh)
            with torch.no_grad(): ref = wrapped(x)
            ref = ref if isinstance(ref, tuple) else (ref,)
            got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})
            diffs.append(max(float(np.abs(r.numpy() - g).max()) for r, g in zip(ref, got)))
        print(name, "dynamo" if dynamo else "legacy", "export %.1fs" % (time.time()-t), "maxdiff", diffs)
