#!/usr/bin/env python3
"""timm models at a realistic size on a CUDA GPU: batch 16, 224x224, inference, random weights.
For each model named on the command line: kiln's and Inductor's error against eager (relative
to the output's scale, TF32 off), then eager, Inductor and kiln in interleaved rounds (median
of CUDA-event timings over 10 calls), and kiln's parts and fallbacks.

    tests/gpu/with_pack.sh PACK python3 tests/gpu/timm_quick.py poolformer_s12 convnext_atto
"""
import sys, statistics, torch, warnings
sys.path.insert(0, "tests/gpu")
import kiln.torch as kt, timm
from reduce_accuracy_gpu import kilnd_binary, local_client
warnings.simplefilter("ignore")
torch.backends.cudnn.allow_tf32 = False; torch.backends.cuda.matmul.allow_tf32 = False
with local_client(kilnd_binary("pf"), "pf-") as client, torch.no_grad():
    for name in sys.argv[1:]:
        torch._dynamo.reset(); kt.reset_stats()
        m = timm.create_model(name, pretrained=False).cuda().eval(); x = torch.randn(16, 3, 224, 224, device="cuda")
        fns = {"eager": m, "Inductor": torch.compile(m), "kiln": torch.compile(m, backend="kiln", options={"client": client})}
        want = m(x)
        errs = {k: ((f(x) - want).abs().max() / want.abs().max()).item() for k, f in fns.items()}
        kt.wait()
        t = {k: [] for k in fns}
        for _ in range(5):
            for k, f in fns.items():
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record(); [f(x) for _ in range(10)]; e.record(); e.synchronize(); t[k].append(s.elapsed_time(e) / 10)
        med = {k: statistics.median(v) for k, v in t.items()}
        st = kt.stats()
        print(f"{name}: err kiln {errs['kiln']:.1e} ind {errs['Inductor']:.1e} | eager {med['eager']:.3f} ind {med['Inductor']:.3f} kiln {med['kiln']:.3f} ms, kiln/ind {med['kiln']/med['Inductor']:.3f} | parts {st['parts']} failed {st['failed']}", flush=True)
