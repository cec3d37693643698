"""PROBE (prepared in the twenty-fifth session, run in the twenty-sixth, 2026-11-29): the token contract's d=64
forward in FlashAttention-3's program shape, in Gluon. On an H200 its O equals the Triton forward's and it runs
19-23% slower: its two consumer warps a scheduler are too few for this issue-bound loop (the `occupancy` mode:
the Triton forward at that occupancy loses 14-26% too; docs/kernel-notes.md, "Twenty-sixth session"). Not kept.

One program per 128 q rows and head, one program an SM: two consumer warpgroups of 64 rows each (warp-specialised
partitions at 240 registers, setmaxnreg) and a producer warp (24 registers) that copies Q^ once, then K^, V^T and s_K
of every 128-key tile into a ring (TMA, "full" mbarriers; a slot is refilled once both consumers arrive on its
"empty" one). Each consumer runs forward.py's TOKEN arithmetic (no Q-smoothing) in experimental/forward_hopper.py's
order: tile j's S = Q^ K^T and tile j-1's P^ V^ issued together, tile j's softmax and P^ while both run, the update
of O one tile late. P^ stays in registers as the product's A operand (16 a thread in INT8; the twenty-second
session's 4-warp Gluon token forward, 3 programs an SM at 168 registers, took it through shared memory and a
barrier per tile and ran +23% causal). Q^ comes from the quantise launch (quantize_q=True); the Triton forward it
is compared with reads the same Q^ (no QUANTIZE_Q), so both kernels do the same work.

    python docs/measurements/ws-forward-probe.py offline       (no GPU: registers, spills, shared memory, the
                                                                 consumers' loop in SASS per score element)
    python docs/measurements/ws-forward-probe.py check         (GPU: O and LSE against the Triton forward's)
    python docs/measurements/ws-forward-probe.py time NAME     (GPU: both kernels, writes $OUT/NAME.json)
    python docs/measurements/ws-forward-probe.py occupancy NAME
        (GPU: the Triton forward with 2, 3 and 4 programs an SM, set by its ring's depth, i.e. by its shared memory;
         the probe runs 2 warps on each of an SM's four schedulers; writes $OUT/NAME.json)

The offline mode needs Triton 3.6 (the GPU's) first on PYTHONPATH; from the repository root.
"""
import json
import math
import os
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from sagebwd.triton._common import program_tile
from sagebwd.triton.dkdv_hopper import _cta_barrier, as_a_operand
from sagebwd.triton.hopper import desc
from sagebwd.triton.schedule import heads_per_section, tile_grid

G_LOG2E = gl.constexpr(1.4426950408889634)
G_LN2 = gl.constexpr(0.6931471805599453)
G_MAGIC_F = gl.constexpr(12582912.0)   # 1.5 * 2**23: _common.MAGIC_F

ROWS = 64             # q rows of a consumer warpgroup
KEYS = 128            # the token contract's kv tile (validate.key_tile)
STAGES = 3            # K^ / V^T / s_K tiles in the ring
CONSUMER_REGS = 240   # 2 x 128 threads x 240 + 128 x 24 (a warpgroup slot) <= 64 K registers: 1 program an SM
PRODUCER_REGS = 24


@gluon.jit
def _producer(q_desc, k_desc, v_desc, sk_desc, q_smem, k_smem, v_smem, sk_smem, q_bar, full, empty, q_row0, k_row0,
              v_row0, n_tiles, STAGES: gl.constexpr, KEYS: gl.constexpr, ROWS: gl.constexpr):
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row0, 0], q_bar, q_smem.index(0))
    tma.async_copy_global_to_shared(q_desc, [q_row0 + ROWS, 0], q_bar, q_smem.index(1))
    for j in range(n_tiles):
        slot = j % STAGES
        if j >= STAGES:   # both consumers are done with the tile this slot held
            mbarrier.wait(empty.index(slot), ((j // STAGES) - 1) & 1)
        bar = full.index(slot)
        mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes + sk_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [k_row0 + j * KEYS, 0], bar, k_smem.index(slot))
        tma.async_copy_global_to_shared(v_desc, [v_row0, j * KEYS], bar, v_smem.index(slot))
        tma.async_copy_global_to_shared(sk_desc, [k_row0 + j * KEYS], bar, sk_smem.index(slot))


@gluon.jit
def _token_probs(x, sk, q_scale, offs_m, offs_n, MASK: gl.constexpr):
    """forward.py's token tile: S = x s_K s_Q (s_Q with sm_scale log2(e) in q_scale); (t, its row max, and P~ =
    exp2(S - t))."""
    xs = x.to(gl.float32) * sk[None, :]
    if MASK:
        t = gl.max(gl.where(offs_m[:, None] >= offs_n[None, :], xs, float("-inf")), axis=1)
    else:
        t = gl.max(xs, axis=1)
    t = gl.where(t == float("-inf"), float("-inf"), t * q_scale)
    t_safe = gl.where(t == float("-inf"), 0.0, t)
    p = gl.exp2(xs * q_scale[:, None] - t_safe[:, None])
    if MASK:
        p = gl.where(offs_m[:, None] >= offs_n[None, :], p, 0.0)
    return t, p


@gluon.jit
def _p8(p, p_layout: gl.constexpr):
    """P^ = round(127 P~) (the magic number's low byte) as the A operand of P^ V^ (V^T in k order), in registers."""
    bits = (p * 127.0 + G_MAGIC_F).to(gl.int32, bitcast=True)
    return as_a_operand(bits.to(gl.int8), p_layout)


@gluon.jit
def _step(j, acc, l_i, m_i, alpha, c, p8, q_tile, k_smem, v_smem, sk_smem, full, empty, q_scale, SV_bh, offs_m,
          offs_n, STAGES: gl.constexpr, KEYS: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr,
          p_layout: gl.constexpr, MASK: gl.constexpr):
    """Tile j's S and tile j-1's P^ V^ on the tensor cores while tile j's softmax runs; O's update for tile j-1."""
    ROWS_: gl.constexpr = q_tile.shape[0]
    HEAD_DIM: gl.constexpr = q_tile.shape[1]
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    slot = j % STAGES
    prev = (j - 1) % STAGES
    mbarrier.wait(full.index(slot), (j // STAGES) & 1)
    s_tok = warpgroup_mma(q_tile, k_smem.index(slot).permute((1, 0)), gl.zeros([ROWS_, KEYS], gl.int32, s_layout),
                          use_acc=False, is_async=True)
    pv_tok = warpgroup_mma(p8, v_smem.index(prev).permute((1, 0)), gl.zeros([ROWS_, HEAD_DIM], gl.int32, o_layout),
                           use_acc=False, is_async=True)
    sk = sk_smem.index(slot).load(gl.SliceLayout(0, s_layout))
    sv = gl.load(SV_bh + j)
    x = warpgroup_mma_wait(1, deps=[s_tok])
    t, p = _token_probs(x, sk, q_scale, offs_m, j * KEYS + offs_n, MASK)
    p_sum = gl.sum(p, axis=1)
    p8_next = _p8(p, p_layout)
    m_new = gl.maximum(m_i, t)
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha_next = gl.exp2(m_i - m_safe)
    w = gl.exp2(t - m_safe)
    l_i = l_i * alpha_next + w * p_sum
    pv = warpgroup_mma_wait(0, deps=[pv_tok])
    _cta_barrier()   # every warp of this warpgroup is done with tile j-1's K^ (S, last step) and V^ (just now)
    mbarrier.arrive(empty.index(prev))
    acc = (acc * gl.convert_layout(alpha, row_o)[:, None]
           + pv.to(gl.float32) * gl.convert_layout(c, row_o)[:, None])
    return acc, l_i, m_new, alpha_next, w * (sv * (1.0 / 127.0)), p8_next


@gluon.jit
def _consumer(HALF: gl.constexpr, q_smem, k_smem, v_smem, sk_smem, q_bar, full, empty, SQ, SV_bh, O_bh, LSE, bh,
              N, start_m, n_tiles, stride_on, sm_scale, HEAD_DIM: gl.constexpr, KEYS: gl.constexpr,
              STAGES: gl.constexpr, CAUSAL: gl.constexpr):
    """Rows start_m + 64 HALF .. of the program: the loop of experimental/forward_hopper.py in the token contract."""
    ROWS_: gl.constexpr = q_smem.shape[1]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, KEYS, 32])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 32])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    m0 = start_m + HALF * ROWS_
    offs_m = m0 + gl.arange(0, ROWS_, layout=row_s)
    offs_n = gl.arange(0, KEYS, layout=gl.SliceLayout(0, s_layout))
    q_scale = gl.load(SQ + bh * N + offs_m) * (sm_scale * G_LOG2E)
    q_tile = q_smem.index(HALF)

    # Tile 0 (forward.py's first iteration: m = t, alpha = 0, w = 1)
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(full.index(0), 0)
    x = warpgroup_mma(q_tile, k_smem.index(0).permute((1, 0)), gl.zeros([ROWS_, KEYS], gl.int32, s_layout),
                      use_acc=False)
    sk = sk_smem.index(0).load(gl.SliceLayout(0, s_layout))
    if CAUSAL and n_tiles == 1:
        t, p = _token_probs(x, sk, q_scale, offs_m, offs_n, True)
    else:
        t, p = _token_probs(x, sk, q_scale, offs_m, offs_n, False)
    m_i = t
    l_i = gl.sum(p, axis=1)
    p8 = _p8(p, p_layout)
    alpha = gl.zeros([ROWS_], gl.float32, row_s)
    c = gl.load(SV_bh) * (1.0 / 127.0) + alpha
    acc = gl.zeros([ROWS_, HEAD_DIM], gl.float32, o_layout)

    # Causal: the diagonal tile (the last) is peeled off, so the loop body has no mask.
    if CAUSAL:
        n_unmasked = n_tiles - 1
    else:
        n_unmasked = n_tiles
    for j in range(1, n_unmasked):
        acc, l_i, m_i, alpha, c, p8 = _step(j, acc, l_i, m_i, alpha, c, p8, q_tile, k_smem, v_smem, sk_smem, full,
                                            empty, q_scale, SV_bh, offs_m, offs_n, STAGES, KEYS, s_layout, o_layout,
                                            p_layout, False)
    if CAUSAL:
        if n_tiles > 1:
            acc, l_i, m_i, alpha, c, p8 = _step(n_tiles - 1, acc, l_i, m_i, alpha, c, p8, q_tile, k_smem, v_smem,
                                                sk_smem, full, empty, q_scale, SV_bh, offs_m, offs_n, STAGES, KEYS,
                                                s_layout, o_layout, p_layout, True)
    last = (n_tiles - 1) % STAGES
    pv = warpgroup_mma(p8, v_smem.index(last).permute((1, 0)), gl.zeros([ROWS_, HEAD_DIM], gl.int32, o_layout),
                       use_acc=False)
    _cta_barrier()
    mbarrier.arrive(empty.index(last))
    acc = acc * gl.convert_layout(alpha, row_o)[:, None] + pv.to(gl.float32) * gl.convert_layout(c, row_o)[:, None]
    o = acc * (1.0 / gl.convert_layout(l_i, row_o))[:, None]
    offs_mo = m0 + gl.arange(0, ROWS_, layout=row_o)
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    gl.store(O_bh + offs_mo[:, None] * stride_on + offs_d[None, :], o.to(O_bh.dtype.element_ty))
    gl.store(LSE + bh * N + offs_m, m_i * G_LN2 + gl.log(l_i))


@gluon.jit
def _ws_forward_kernel(q_desc, k_desc, v_desc, sk_desc, SQ, SV, O, LSE, stride_ob, stride_oh, stride_on, sm_scale, N,
                       H, SECTION, ROWS: gl.constexpr, KEYS: gl.constexpr, HEAD_DIM: gl.constexpr,
                       CAUSAL: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                       PRODUCER_REGS: gl.constexpr):
    gl.static_assert(2 * ROWS == KEYS, "a program's 128 rows are one kv tile: the causal diagonal is its last tile")
    # Causal: the last q blocks see the most keys; they run first (rank 0, schedule.py).
    rank, bh = program_tile(N // KEYS, SECTION)
    pid_m = N // KEYS - 1 - rank
    start_m = pid_m * KEYS
    if CAUSAL:
        n_tiles = pid_m + 1
    else:
        n_tiles = N // KEYS
    q_smem = gl.allocate_shared_memory(gl.int8, [2, ROWS, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(gl.int8, [STAGES, KEYS, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(gl.int8, [STAGES, HEAD_DIM, KEYS], v_desc.layout)
    sk_smem = gl.allocate_shared_memory(gl.float32, [STAGES, KEYS], sk_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar.index(0), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)   # one arrive per consumer
    O_bh = O + (bh // H).to(gl.int64) * stride_ob + (bh % H).to(gl.int64) * stride_oh
    SV_bh = SV + bh * (N // KEYS)
    gl.warp_specialize([
        (_consumer, (0, q_smem, k_smem, v_smem, sk_smem, q_bar.index(0), full, empty, SQ, SV_bh, O_bh, LSE, bh, N,
                     start_m, n_tiles, stride_on, sm_scale, HEAD_DIM, KEYS, STAGES, CAUSAL)),
        (_consumer, (1, q_smem, k_smem, v_smem, sk_smem, q_bar.index(0), full, empty, SQ, SV_bh, O_bh, LSE, bh, N,
                     start_m, n_tiles, stride_on, sm_scale, HEAD_DIM, KEYS, STAGES, CAUSAL)),
        (_producer, (q_desc, k_desc, v_desc, sk_desc, q_smem, k_smem, v_smem, sk_smem, q_bar.index(0), full, empty,
                     bh * N + start_m, bh * N, bh * HEAD_DIM, n_tiles, STAGES, KEYS, ROWS)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


def launch_args(q8, k8, v8t, s_q, s_k, s_v, o, lse, causal: bool):
    """(grid, args, kwargs) of the probe's launch on the quantise launch's outputs (token, quantize_q=True)."""
    b, h, n, d = q8.shape
    assert d == 64 and n % KEYS == 0, "the probe: head dim 64, a sequence a multiple of 128"
    args = (desc(q8.reshape(b * h * n, d), [ROWS, d]), desc(k8.reshape(b * h * n, d), [KEYS, d]),
            desc(v8t.reshape(b * h * d, n), [d, KEYS]), desc(s_k.reshape(b * h * n), [KEYS]),
            s_q, s_v, o, lse, *o.stride()[:3], 1.0 / math.sqrt(d), n, h, heads_per_section(causal, b * h, (k8, v8t)))
    kwargs = dict(ROWS=ROWS, KEYS=KEYS, HEAD_DIM=d, CAUSAL=causal, STAGES=STAGES, CONSUMER_REGS=CONSUMER_REGS,
                  PRODUCER_REGS=PRODUCER_REGS, num_warps=4)
    return tile_grid(n // KEYS, b * h), args, kwargs


def operands(q, k, v):
    """The quantise launch's Q^, K^, V^T and scales (token, K-smoothing by K's mean, Q quantised there)."""
    from sagebwd.triton import quantize
    q8, _, s_q, _, k8, _, s_k, v8t, s_v, _ = quantize.quantize_smoothed_qkv(q, k, v, 128, 64, smooth_q=False,
                                                                           cols=False, token=True, quantize_q=True)
    return q8, k8, v8t, s_q, s_k, s_v


def run_probe(q8, k8, v8t, s_q, s_k, s_v, causal: bool):
    o = torch.empty(q8.shape, device=q8.device, dtype=torch.bfloat16)
    lse = torch.empty(q8.shape[:3], device=q8.device, dtype=torch.float32)
    grid, args, kwargs = launch_args(q8, k8, v8t, s_q, s_k, s_v, o, lse, causal)
    _ws_forward_kernel[grid](*args, **kwargs)
    return o, lse


def run_triton(q8, k8, v8t, s_q, s_k, s_v, causal: bool, tuning=None):
    from sagebwd.triton import forward
    return forward.run(q8, k8, v8t, s_q, s_k, s_v, out_dtype=torch.bfloat16, causal=causal, smooth_k=True, mu_q=None,
                       k=None, k_mean=None, block_q=128, block_kv=64, layout_of=None, quant="token", tuning=tuning)


def offline():
    """Compile for sm_90 without a GPU: registers, spills, shared memory; the consumers' loop per score element."""
    from tools import sass_mix
    from tools.offline import _resource_usage, compile_recorded
    for causal in (False, True):
        b, h, n, d = 1, 2, 1024, 64
        q8, k8 = torch.zeros(b, h, n, d, dtype=torch.int8), torch.zeros(b, h, n, d, dtype=torch.int8)
        v8t = torch.zeros(b, h, d, n, dtype=torch.int8)
        s_q, s_k = torch.zeros(b, h, n), torch.zeros(b, h, n)
        s_v = torch.zeros(b, h, n // KEYS)
        o, lse = torch.zeros(b, h, n, d, dtype=torch.bfloat16), torch.zeros(b, h, n)
        _, args, kwargs = launch_args(q8, k8, v8t, s_q, s_k, s_v, o, lse, causal)
        compiled = compile_recorded(_ws_forward_kernel, args, kwargs)
        usage = _resource_usage(compiled.asm["cubin"])
        sass = sass_mix.disassemble(compiled.asm["cubin"])
        instructions, loops = sass_mix.instructions_and_loops(sass)
        first, last = sass_mix.main_loop(loops)
        body = instructions[first:last + 1]
        per_element = len(body) * 32 * 4 / (ROWS * KEYS)   # one consumer: 4 warps, 64 x 128 elements a trip
        ops = {}
        for text in body:
            ops[sass_mix.opcode(text)] = ops.get(sass_mix.opcode(text), 0) + 32 * 4 / (ROWS * KEYS)
        top = ", ".join(f"{k} {v:.2f}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:8])
        print(f"{'causal' if causal else 'full'}: {usage} shared {compiled.metadata.shared} B; "
              f"loop {per_element:.1f} SASS per score element ({top}); "
              f"local memory in loops: {sass_mix.local_memory_in_loops(sass)}")


def check():
    rows = {}
    for (b, h, n), causal in [((1, 2, 256), True), ((1, 2, 256), False), ((2, 3, 1024), True), ((1, 1, 128), True),
                              ((2, 3, 1024), False)]:
        gen = torch.Generator().manual_seed(n + causal)
        q, k, v = [(torch.randn(b, h, n, 64, generator=gen) * 2).bfloat16().cuda() for _ in range(3)]
        ops = operands(q, k, v)
        o, lse = run_probe(*ops, causal)
        o_ref, lse_ref = run_triton(*ops, causal)
        rows[f"{(b, h, n, 64)} {'causal' if causal else 'full'}"] = {
            "o_rel_l2": ((o.float() - o_ref.float()).norm() / o_ref.float().norm()).item(),
            "lse_max_abs": (lse - lse_ref).abs().max().item()}
    print(json.dumps(rows, indent=1))
    assert all(r["o_rel_l2"] < 1e-2 and r["lse_max_abs"] < 1e-3 for r in rows.values()), "the probe's O is off"


def time(name):
    from benchmarks.attention import profiled_ms
    from benchmarks.forward_tiles import probe_inputs
    rows = []
    for shape in [(8, 16, 4096, 64), (4, 12, 4096, 64)]:
        for sink in (False, True):
            ops = operands(*probe_inputs(shape, sink))
            for causal in (True, False):
                row = dict(shape=shape, sink=sink, causal=causal)
                for label, fn in (("triton", run_triton), ("ws", run_probe)):
                    ms = profiled_ms(lambda: fn(*ops, causal), 10, warmup=3)
                    row[label] = next(t for k, t in ms.items() if "forward_kernel" in k)
                rows.append(row)
                print(f"{shape} {'sink' if sink else 'iid ':4s} {'causal' if causal else 'full':6s}: Triton "
                      f"{row['triton']:.4f} ms, ws {row['ws']:.4f} ms ({100 * (row['ws'] / row['triton'] - 1):+.1f}%)",
                      flush=True)
    json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), name + ".json"), "w"), indent=1)


def programs_per_sm(compiled, warps: int) -> int:
    """Resident programs an SM (Hopper: 64 K registers, 227 KB of shared memory a block's limit, 228 KB an SM with
    1 KB reserved a block, 64 warps)."""
    by_regs = 65536 // (compiled.n_regs * 32 * warps)
    by_smem = 233472 // (compiled.metadata.shared + 1024) if compiled.metadata.shared else 32
    return min(by_regs, by_smem, 64 // warps)


def occupancy(name):
    """The Triton forward with its ring 3 (today), 4, 5 and 6 tiles deep: each stage holds a K^ and a V^T tile, so
    the depth sets how many programs share an SM (4 warps each); the question is whether the probe's loss is its two
    warps a scheduler."""
    from benchmarks.attention import profiled_ms
    from benchmarks.forward_tiles import probe_inputs
    from sagebwd.triton.launch import Tuning
    rows = []
    for shape in [(8, 16, 4096, 64), (4, 12, 4096, 64)]:
        ops = operands(*probe_inputs(shape, False))
        for causal in (True, False):
            row = dict(shape=shape, causal=causal)
            for stages in (3, 4, 5, 6):
                tuning = Tuning(overrides={"forward": {"num_stages": stages}}, compiled={})
                ms = profiled_ms(lambda: run_triton(*ops, causal, tuning), 10, warmup=3)
                compiled = tuning.compiled["forward"]
                row[f"stages{stages}"] = dict(ms=next(t for k, t in ms.items() if "forward_kernel" in k),
                                              regs=compiled.n_regs, shared=compiled.metadata.shared,
                                              programs_per_sm=programs_per_sm(compiled, 4))
            ms = profiled_ms(lambda: run_probe(*ops, causal), 10, warmup=3)
            row["ws"] = next(t for k, t in ms.items() if "forward_kernel" in k)
            rows.append(row)
            base = row["stages3"]["ms"]
            cells = ", ".join(f"{s}: {v['ms']:.4f} ms {v['programs_per_sm']}/SM ({100 * (v['ms'] / base - 1):+.1f}%)"
                              for s, v in row.items() if s.startswith("stages"))
            print(f"{shape} {'causal' if causal else 'full':6s}: {cells}; ws {row['ws']:.4f} ms "
                  f"({100 * (row['ws'] / base - 1):+.1f}%)", flush=True)
    json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), name + ".json"), "w"), indent=1)


if __name__ == "__main__":
    if sys.argv[1:] == ["offline"]:
        offline()
    elif sys.argv[1:] == ["check"]:
        check()
    elif len(sys.argv) == 3 and sys.argv[1] == "time":
        time(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "occupancy":
        occupancy(sys.argv[2])
    else:
        sys.exit(f"usage: python {sys.argv[0]} offline | check | time NAME | occupancy NAME "
                 f"(got {' '.join(sys.argv[1:]) or 'no arguments'})")
