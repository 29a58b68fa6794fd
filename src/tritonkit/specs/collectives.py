"""Specs of the collectives (``tritonkit.dist``), run on several ranks by harness/distributed.py
(gloo on the CPU, NCCL with a GPU per rank): the ring all-reduce and the symmetric-memory
all-reduce against torch.distributed's all-reduce (the reference, on float64 copies: the exact
sum). Bytes are nccl-tests' bus bytes of an all-reduce: ``2 (n - 1) / n`` of the buffer,
counted once for the input and once for the output."""

import warnings

import torch

from tritonkit.harness.spec import Baseline, Distributed, OpSpec, Shapes, register
from tritonkit.specs._common import generator, nbytes, randn

FAMILY = "collectives"
WORLD = 2  # the world size is the Distributed field's: the same specs run at 4 or 8 ranks


def _inputs(shape, dtype, device, seed):
    return (randn(shape, dtype, device, generator(device, seed)),)


def _reference(x):
    out = x.contiguous().clone()  # NCCL takes contiguous tensors only (gloo any)
    torch.distributed.all_reduce(out)
    return out


def _ring(x):
    from tritonkit import dist

    out = x.clone()
    dist.ring_all_reduce(out)
    return out


def _symm(x):
    from tritonkit import dist

    out = x.clone()
    with warnings.catch_warnings():  # on the CPU: NCCL's (gloo's) path, which it says once
        warnings.simplefilter("ignore", UserWarning)
        dist.symm_all_reduce(out)
    return out


def _bus_bytes(inputs, mode, **params):
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else WORLD
    return int(2 * nbytes(inputs[0]) * 2 * (world - 1) / world)


def _nccl():
    return {
        "nccl": Baseline(
            "nccl", lambda: _reference, backward=False, description="torch.distributed.all_reduce"
        )
    }


for _name, _impl, _shapes in (
    (
        "ring_all_reduce",
        _ring,
        Shapes(test=[(3, 129), (7,), (1,)], bench=[(1 << 26,)], empty=[(0,)]),
    ),
    ("symm_all_reduce", _symm, Shapes(test=[(3, 129), (7,)], bench=[(1 << 16,)], empty=[(0,)])),
):
    register(
        OpSpec(
            name=_name,
            family=FAMILY,
            impl=_impl,
            reference=_reference,
            make_inputs=_inputs,
            shapes=_shapes,
            bytes=_bus_bytes,
            dtypes=(torch.float32, torch.bfloat16),
            bench_dtypes=(torch.bfloat16,),
            backward=False,
            baselines=_nccl(),
            # Under the CPU interpreter a rank may compute for minutes between two collectives
            # while the machine is loaded; the wait bound is for a rank that never arrives.
            distributed=Distributed(world_size=WORLD, timeout_s=600.0),
            description=f"tritonkit.dist.{_name} against torch.distributed.all_reduce",
        )
    )
