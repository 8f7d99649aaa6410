"""The schedules' launch shapes, and the measurements behind each.

Every constant :mod:`.schedule` and the kernel builders (:mod:`.rows`, :mod:`.fullred`,
:mod:`.columns`, :mod:`.rowsplit`, ...) size blocks, grids, per-thread work and variant
thresholds with, beside the H200 figures that chose it: change one here and the reason for the
old value is in front of you. Values a test or a benchmark sweeps at run time (``ROW_SPLIT``,
the ``SPLIT_`` family, ``GRID_X_MAX``, ``HEAVY_POINTWISE``, ``LONG_MATH_POINTWISE``, ...) are read
as ``tuning.NAME`` when a fusion is compiled, so ``monkeypatch.setattr(tuning, "ROW_SPLIT",
False)`` reaches every schedule; the block sizes the kernel builders import by value
(``BLOCK``, ``CHUNK``, ...) are fixed for the process. They are part of the code: the cache key
covers them through kernelpack's version, not one by one.
"""

from __future__ import annotations

__all__ = ["BLOCK", "ROW_BLOCK", "WARP_ROWS", "CHUNK", "UNROLL", "COMBINE_UNROLL", "GRID_CAP",
           "THREAD_ROW_MAX", "WARP_ROW_MAX", "WARP_KEEP_MAX", "MIN_THREADS_PER_SM",
           "ONE_ROW_MIN_THREADS", "TILE_CHUNKS", "TILE_WARP_MAX", "TILE_BLOCK", "REG_GROUPS",
           "REG_GROUPS_WIDE", "REG_GROUPS_LIGHT", "REG_GROUPS_LIGHT_WIDE", "HEAVY_POINTWISE",
           "LONG_MATH_POINTWISE", "GRID_X_MAX", "ROW_SPLIT", "SPLIT_MIN_LENGTH", "SPLIT_MAX_ROWS",
           "SPLIT_REDUCE_MIN_LENGTH", "SPLIT_REDUCE_MAX_ROWS", "SPLIT_CHUNK", "SPLIT_BLOCK",
           "SPLIT_COMBINE_BLOCK"]

BLOCK = 256            # threads per block of pointwise, thread-per-row and partial kernels
ROW_BLOCK = 512        # threads of a block-per-row kernel
WARP_ROWS = BLOCK // 32
CHUNK = 8192           # elements per partial of a full reduction (32 per thread)
UNROLL = 4             # independent accumulators per thread in a partial
COMBINE_UNROLL = 8     # the same where a row kernel combines workspace partials (rows.py)
GRID_CAP = 65535       # grid-stride loops cover the rest; keeps grids launchable everywhere
THREAD_ROW_MAX = 32    # reduce-only rows this short: one thread per row
WARP_ROW_MAX = 4096    # reduce-only rows up to this: one warp per row
WARP_KEEP_MAX = 2048   # rows that are also written back (softmax): warp up to this
MIN_THREADS_PER_SM = 512  # register-held rows: ptxas keeps registers within 65536 / this
# thread rows whose terms are light (no transcendental or division per term: phase, not angle)
# and whose per-row work has a transcendental (phase's sincos, not masked_mean's division) get
# a second kernel for launches where every thread owns one row (rows <= GRID_CAP·BLOCK), with
# registers for this many resident threads per SM, by the accumulator width in bytes
# (:func:`acc_width`; 0: no such variant). One row per thread is latency-bound (a short sum,
# then one float64 sincos per thread): more resident threads hide it. H200, B = 128, phase
# float64 against the unbounded kernel (58 registers; 30 here): n = 14 / 15 / 16 -9 / -8 /
# -10%, kp/NVRTC 1.14 -> 1.03 (n = 14), 1.09 -> 0.96 (n = 16); at 2048 for every launch it
# was 6-9% slower at n = 18/20, angle and float32 kernels 0-4% slower at every n, masked_mean
# float64 (rows of 8..32) 3-8% slower one row per thread (notes/encoding-perf.md).
ONE_ROW_MIN_THREADS = {4: 0, 8: 2048}
# reduce-only rows (masked means) longer than a thread's: tiled loops (lowering/tiles.py), each
# lane TILE_CHUNKS 16-byte chunks per input in flight per iteration; a warp per row up to
# TILE_WARP_MAX elements, then TILE_BLOCK threads per row. The plain loops held ~20 bytes in
# flight per thread (H200, masked_mean 4096 x 16384 float32: 42% of copy bandwidth). Rows of
# 2049..4096 take blocks too: masked_mean 16384 x 4096 ran at 90.2% of copy bandwidth with a
# warp per row, 91.6% with 256 threads (Triton 92.1%; .gpu/h5/bench3.py, notes/row-perf.md).
TILE_CHUNKS = 4        # 0: the plain loops (kept for comparisons)
TILE_WARP_MAX = 2048
TILE_BLOCK = 256
# register-held rows: (group, 16-byte chunks per thread, threads per block[, resident threads
# per SM ptxas keeps registers for: MIN_THREADS_PER_SM when left out]), in order; each holds
# rows up to (32 or threads)·chunks·vec elements. Up to 1024 f32: 8 per thread, more threads
# per row as rows grow (exp-heavy rows need the warps), registers for 1536-2048 resident
# threads (40 registers at 1536, no spills); 2048 and 4096: 16 per thread in blocks of 128 and
# 256 (1024 resident, <= 64 registers); 8192: 32 per thread in blocks of 256 (768 resident: 3
# rows per SM in 80 registers, no spills, since regrows tests a chunk's place against one
# remaining length; 114 registers and 2 rows per SM before). H200, float32 softmax, % of copy
# bandwidth (and time / Triton's) after the float32 group sums and max.NaN.f32: 65536x1024
# 92.5 -> 98.1 (1.05 -> 0.99) with 1536 resident threads; 8192x8192 91.3 -> 94.4 (1.04 ->
# 1.01) with 256 x 32 against 512 x 16, then 1.017 -> 1.007 at 768 resident and 8192x8190
# (the scalar body) 1.13 -> 0.99 (session 51); 262144x256 89 -> 96 and 524288x128 79 -> 91
# with 1536 / 2048 resident (2048 spills 24 bytes for 256); see notes/row-perf.md
REG_GROUPS = (("warp", 1, BLOCK, 2048), ("warp", 2, BLOCK, 1536), ("block", 2, 64, 1536),
              ("block", 2, 128, 1536), ("block", 4, 128, 1024), ("block", 4, 256, 1024),
              ("block", 8, 256, 768))
# the same for 8-byte elements (float64 softmax): the groups measured before the float32 tuning
# above (2048 resident threads would spill a float64 warp row; unmeasured otherwise)
REG_GROUPS_WIDE = (("warp", 1, BLOCK, 1024), ("warp", 2, BLOCK, 1024), ("block", 2, 64, 1024),
                   ("block", 2, 128, 1024), ("block", 4, 128, 1024), ("block", 4, 256, 1024),
                   ("block", 4, 512, 1024))
# rows without per-element transcendentals or divisions (layernorm): 32 f32 per thread from
# 513 on (~128 registers, 512 resident threads per SM): more bytes in flight per register.
# H200, float32 layernorm: 65536x1024 91% of copy bandwidth for a warp per row with 32 per
# thread against 81% for 128 threads with 8; 32768x2048 67 -> 93% and 16384x4096 70 -> 94% for
# 64/128 threads with 32 each against 256 threads with 8/16 (softmax, with its exp, the other
# way round: 32 per thread at 59% against 84% for 8 per thread at 1024)
REG_GROUPS_LIGHT = (("warp", 1, BLOCK), ("warp", 2, BLOCK), ("block", 2, 64), ("warp", 8, BLOCK),
                    ("block", 8, 64), ("block", 8, 128), ("block", 8, 256))
# the same for 8-byte elements (float64 layernorm: 32 per thread spills 72 bytes; unmeasured on
# a GPU, so the groups used before the change above stay)
REG_GROUPS_LIGHT_WIDE = REG_GROUPS_LIGHT[:4] + (("block", 2, 256), ("block", 4, 256),
                                                ("block", 8, 256))

# Few, long rows split across blocks (lowering/rowsplit.py): rows written back (softmax,
# layernorm) where length >= SPLIT_MIN_LENGTH and rows <= SPLIT_MAX_ROWS, per-row outputs
# (x.sum(-1), logsumexp) where length >= SPLIT_REDUCE_MIN_LENGTH and rows <=
# SPLIT_REDUCE_MAX_ROWS; blocks of SPLIT_BLOCK threads reduce SPLIT_CHUNK elements each (a
# multiple of SPLIT_BLOCK·UNROLL), a block of SPLIT_COMBINE_BLOCK per row combines them.
# H200, benchmarks/rowsplit.py (06:02 UTC; notes/rowsplit.md): chunk and block sizes from 2048
# to 16384 and 128 to 512 within noise of each other (512-thread partial blocks 5-30% slower),
# so 4096/256/256 stay. A block per row streams ~20 GB/s of a softmax row (3 reads + a write;
# (1, 2^20): 0.80 ms, split 0.040 ms) and the split costs ~40 us of fixed work (5 launches),
# so written-back rows split from 65536 (at 32768 the split lost 0.3-0.6x at 64-256 rows; at
# 65536 it won 1.1-1.3x from 128 rows); per-row outputs keep tiled blocks that stream ~3x
# faster: the split won at (32, 262144) 1.15x, (16, 2^20) 2.0x, (8, 10^6) 2.8x, and lost at
# (32, 65536) 0.87x, (256, 65536) 0.92x, tied at (64, 262144). ROW_SPLIT = False: the previous
# schedules.
# Pointwise kernels whose per-element work has a transcendental or a division (gelu's tanh):
# (threads per block, 16-byte groups per thread, a block apart, all loads issued first), on a
# grid of up to GRID_X_MAX blocks. H200, gelu float32 (time / torch eager, two runs): 64 x 2
# 0.995-1.008 (2^26) and 0.998-0.999 (2^28), 128 x 2 0.998-1.005 / 1.000-1.001, the one group
# of 256 threads on a capped grid it replaces 1.010-1.017 / 1.008-1.009; 64 x 1 and 32 x 2
# 1.24 (too few resident threads), 64 x 4 1.015-1.017. Light kernels (axpy) keep one group
# per thread: there every variant was within 0.5% of eager (.gpu/exptree/pw_probe*.py, 05:45).
HEAVY_POINTWISE = (64, 2)
# ... and those led by a long libdevice routine (:func:`.traits.long_inlined_math`): one group
# per thread in blocks of 128, since libdevice inlines the routine once per element a thread
# holds. H200 against HEAVY_POINTWISE (notes/compile-time.md, session 17; outputs identical):
# float32 sin/tan 0.99-1.00, sin+cos 0.91, float16 sin+cos 0.54, float64 gelu 0.98; compile
# about halved. Not with a pow, float64 trig or other transcendentals (1.00-1.08 slower).
# Session 34 (.gpu/probe34/tanh_ab.py, outputs identical; 2^24..2^27 + tails): float32 gelu
# 0.982-0.995 and tanh(x)*y 0.984-0.997, so float32 tanh takes it too (gelu compiles in ~60%
# of the time); float32 x*sigmoid(x) 1.002-1.012: it keeps HEAVY_POINTWISE.
LONG_MATH_POINTWISE = (128, 1)
GRID_X_MAX = 2**31 - 1  # the grid's x limit on every CUDA device kernelpack targets
ROW_SPLIT = True
SPLIT_MIN_LENGTH = 65536
SPLIT_MAX_ROWS = 256
SPLIT_REDUCE_MIN_LENGTH = 262144
SPLIT_REDUCE_MAX_ROWS = 32
SPLIT_CHUNK = 4096
SPLIT_BLOCK = 256
SPLIT_COMBINE_BLOCK = 256
