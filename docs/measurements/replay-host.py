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
from launcher.train import micro_batch_loss
from launcher.data import build_batches
from model import Llama

SETS = {"fpa": ["model.attention=fpa"],
        "token": ["model.attention=sagebwd", "model.smoothing=k", "model.quant=token"]}

p = argparse.ArgumentParser()
p.add_argument("--attention", choices=sorted(SETS), required=True)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--top", type=int, default=18)
args = p.parse_args()
config = load_run_config("experiments/configs/gpu-124m.yaml", ["train.micro_batch_size=4", *SETS[args.attention]])
torch.manual_seed(config.seed)
model = Llama(config.model).to(device="cuda", dtype=torch.bfloat16)
x, y = (t.cuda() for t in next(iter(build_batches(config)[0])))
forward = torch.compile(model, mode="reduce-overhead")


def half_step():
    for p_ in model.parameters():
        p_.grad = None
    torch.compiler.cudagraph_mark_step_begin()
    return micro_batch_loss(forward, x, y, config.model.loss_impl)


for _ in range(5):
    half_step().backward()
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
    loss = half_step()
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
