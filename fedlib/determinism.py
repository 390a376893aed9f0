"""The determinism contract: what is bitwise reproducible, and what agrees within a stated tolerance.

**Bitwise.** The same config on the same machine (CPU model or GPU), with the same thread plan
(engine workers ``FEDLIB_CPU_WORKERS``, intra-op threads ``OMP_NUM_THREADS``), the same precision and
the same torch build gives identical bits in everything a run stores: history, final metrics,
scores, the monitor's statistics and the model. Runs that share a process (a thread pool, a
threaded Dask worker) do not change each other's numbers: each equals the run made alone.

**Within a tolerance.** Everything else that only reorders float sums:

* another execution plan on the same machine: another worker count, the balanced vs the masked
  CPU plan, one client at a time vs vmapped groups, chunked clients, a packed run vs the run alone
  (merged convolutions, the shared batched evaluation): :data:`PLAN` (relative difference of the
  parameters after a few local steps; the evaluation's loss within ``PLAN.loss``);
* another CPU model (another SIMD width or BLAS kernel) or a GPU: :data:`CROSS_MACHINE`, on the first
  rounds of a run. Training amplifies rounding, so two machines' histories drift apart over a
  long protocol the way two seeds do, only less: a stored run's later rounds are evidence of the
  protocol, not bits that another machine reproduces.

Where a stored number must not depend on threads at all (the poisoning monitor's statistics), it is
computed in an order fixed by the data alone (``fedlib.screening``).

``fedlib.app.recompute`` checks the committed store against :data:`CROSS_MACHINE`; the tests assert
exactly this contract, so they pass on any x86-64 CPU.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerance:
    """Absolute bounds on what a page reads; ``parameters`` is relative (||a - b|| / ||a||)."""

    parameters: float
    accuracy: float  # a fraction (0.002 = 0.2 points)
    loss: float
    weights: float  # aggregation weights


# Another plan, same machine: a few local steps (tests/core/test_cpu_plan.py, tests/core/test_packing.py).
PLAN = Tolerance(parameters=1e-6, accuracy=1e-6, loss=1e-5, weights=1e-6)

# Another machine, the first two rounds of a stored run (fedlib.app.recompute). Measured: 9 stored MLP
# runs (Fashion-MNIST, MNIST; 9 methods) stored on other x86-64 CPUs, re-computed on an AMD EPYC with
# AVX-512: at most 0.0002 in accuracy, 0.00095 in loss, 0 in weights; the bounds leave 10x.
CROSS_MACHINE = Tolerance(parameters=1e-3, accuracy=0.002, loss=0.01, weights=1e-4)

# bfloat16 local training (RunConfig.precision): another plan on the same machine (one client at a time vs vmapped
# groups, a packed run vs the run alone, channels-last vs contiguous), a few local steps or the first rounds
# (tests/core/test_precision.py). Autocast computes a matmul's or convolution's weight gradient in bfloat16 (8 bits of
# mantissa), so a sum in another order can move it across a rounding boundary (relative 2^-8) where float32
# differs in its last bit. Measured on this CPU: a CNN's parameters after 2-3 steps (lr 0.05, momentum 0.9), one
# client at a time vs vmapped, 5e-4 relative (float32: 7e-9); channels-last vs contiguous 0-5e-10; packed MLP and
# LeNet-5 runs vs alone: identical; LeNet-5 / CNN runs over 3 rounds, clients vs vectorized: accuracy 0.006, loss
# 1.3e-4 apart (near-chance models, whose ties flip). The bounds leave 3-10x. Not covered: BatchNorm networks on
# tiny random batches (ResNet-20 on 8x8 noise), whose gradients are ill-conditioned even in float32.
BFLOAT16 = Tolerance(parameters=5e-3, accuracy=0.02, loss=1e-3, weights=1e-6)
