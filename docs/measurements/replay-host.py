"""Where the host's time goes when a compiled step (torch.compile mode="reduce-overhead", CUDA graph trees) is
issued from an idle device: each recorded graph's inputs and outputs, then cProfile's top functions over the
forward calls and over the backward calls of `--steps` steps (gpu-124m at seq 4096 x 4, one GPU, no DeepSpeed).

    python docs/measurements/replay-host.py --attention fpa|token [--steps 20] [--top 18]
"""
import argparse
import cProfile
import io
import pstats
import time

import torch

from launcher.config import load_run_config
from launcher.profile_step import build_step

SETS = {"fpa": ["model.attention=fpa"],
        "token": ["model.attention=sagebwd", "model.smoothing=k", "model.quant=token"]}

p = argparse.ArgumentParser()
p.add_argument("--attention", choices=sorted(SETS), required=True)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--top", type=int, default=18)
args = p.parse_args()
if args.steps < 1 or args.top < 1:
    p.error(f"--steps {args.steps} --top {args.top}: give positive counts")
config = load_run_config("experiments/configs/gpu-124m.yaml", ["train.micro_batch_size=4", *SETS[args.attention]])
step, _, _ = build_step(config, "reduce-overhead")
for _ in range(5):
    step()
torch.cuda.synchronize()

from torch._inductor import cudagraph_trees  # noqa: E402
manager = cudagraph_trees.get_manager(torch.cuda.current_device(), create_if_none_exists=False)
nodes = [n for roots in (manager.roots.values() if manager else []) for n in roots]
seen = 0
while nodes:
    node = nodes.pop(0)
    seen += 1
    print(f"graph {seen}: {len(node.static_input_data_ptrs)} inputs ({len(node.static_input_idxs)} static), "
          f"{len(node.outputs_metadata)} outputs")
    nodes += [c for children in node.children.values() for c in children]

timings = {"forward": cProfile.Profile(), "backward": cProfile.Profile()}
host = {"forward": [], "backward": []}
for _ in range(args.steps):
    torch.cuda.synchronize()
    began = time.perf_counter()
    timings["forward"].enable()
    loss = step(backward=False)
    timings["forward"].disable()
    issued = time.perf_counter()
    timings["backward"].enable()
    loss.backward()
    timings["backward"].disable()
    host["forward"].append(issued - began)
    host["backward"].append(time.perf_counter() - issued)
torch.cuda.synchronize()
for half, prof in timings.items():
    ms = sorted(host[half])[len(host[half]) // 2] * 1000
    print(f"\n{args.attention} {half}: median {ms:.2f} ms of host time (cProfile on)")
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.top)
    print("\n".join(line for line in out.getvalue().splitlines() if line.strip())[-4000:])
