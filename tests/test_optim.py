"""Optimizer family: tritonkit.optim against torch.optim, state_dicts both ways, non-finite
gradients, bad hyperparameters, and the workbench specs."""

import contextlib
import copy
import sys
from pathlib import Path

import pytest
import torch
from torch.optim._muon import _zeropower_via_newtonschulz

import tritonkit.optim as tko
from tritonkit.ops._core.layout import LAYOUT_COPIES
from tritonkit.ops.optim.config import NS_COEFFICIENTS
from tritonkit.optim.functional import adam_step, newton_schulz

from _checks import assert_spec_passes

TORCH = {tko.Adam: torch.optim.Adam, tko.AdamW: torch.optim.AdamW}


def _mlp(device, seed=1, dtype=torch.float32):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(13, 40),
        torch.nn.Tanh(),
        torch.nn.Linear(40, 24, bias=False),
        torch.nn.Tanh(),
        torch.nn.Linear(24, 3),
    )
    return model.to(device=device, dtype=dtype)


def _rel(a, b):
    """Relative error ||a - b|| / ||b|| (2-norm over the tensor)."""
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def _train(models_opts, device, steps, seed=0, closure=False, schedulers=()):
    gen = torch.Generator(device="cpu").manual_seed(seed)  # host: one draw sequence on every device
    for _ in range(steps):
        x = torch.randn(8, 13, generator=gen).to(device)
        for model, opt in models_opts:
            dtype = next(model.parameters()).dtype

            def loss_fn(model=model, opt=opt, dtype=dtype, x=x):
                opt.zero_grad()
                loss = model(x.to(dtype)).float().square().mean()
                loss.backward()
                return loss

            if closure:
                opt.step(loss_fn)
            else:
                loss_fn()
                opt.step()
        for s in schedulers:
            s.step()


SLOW = pytest.mark.slow
ADAM_OPTIONS = [
    (tko.Adam, {"weight_decay": 0.1}),
    (tko.AdamW, {"amsgrad": True, "maximize": True, "weight_decay": 0.05}),
    (tko.AdamW, {"betas": (0.0, 0.99), "eps": 1e-6}),
    (tko.Adam, {"betas": (0.6, 0.5)}),  # lerp weight >= 0.5 takes ATen's other formula
]
ADAM_CASES = [
    (tko.AdamW, {}),
    pytest.param(tko.Adam, {"amsgrad": True, "maximize": True, "weight_decay": 0.05}, marks=SLOW),
    pytest.param(tko.Adam, {}, marks=SLOW),
    pytest.param(tko.Adam, {"weight_decay": 0.1}, marks=SLOW),
    pytest.param(tko.AdamW, {"weight_decay": 0.1}, marks=SLOW),
    pytest.param(tko.AdamW, {"amsgrad": True, "maximize": True, "weight_decay": 0.05}, marks=SLOW),
    pytest.param(tko.AdamW, {"betas": (0.0, 0.99), "eps": 1e-6}, marks=SLOW),
    # lerp weight >= 0.5 takes ATen's other formula
    pytest.param(tko.Adam, {"betas": (0.6, 0.5)}, marks=SLOW),
]


@pytest.mark.parametrize(("cls", "options"), ADAM_CASES, ids=str)
def test_adam_matches_torch_20_steps(device, cls, options):
    ours, ref = _mlp(device), _mlp(device)
    kw = {"lr": 1e-2, **options}
    opt = cls(ours.parameters(), **kw)
    ref_opt = TORCH[cls](ref.parameters(), foreach=False, **kw)
    _train([(ours, opt), (ref, ref_opt)], device, 20)
    for p, q in zip(ours.parameters(), ref.parameters()):
        assert _rel(p, q) <= 1e-6
        assert float(opt.state[p]["step"]) == float(ref_opt.state[q]["step"]) == 20


@pytest.mark.parametrize(("cls", "options"), ADAM_OPTIONS, ids=str)
def test_adam_state_matches_torch_fixed_gradients(device, cls, options):
    """The same gradients for both (no model in the loop to amplify differences): parameters
    and every state tensor within 1e-6 after 20 steps."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(40, 13, device=device) * 0.1)
    q = torch.nn.Parameter(p.detach().clone())
    kw = {"lr": 1e-2, **options}
    opt, ref_opt = cls([p], **kw), TORCH[cls]([q], foreach=False, **kw)
    _run(opt, p, _grads(p.shape, 20, device, torch.float32))
    _run(ref_opt, q, _grads(p.shape, 20, device, torch.float32))
    assert _rel(p, q) <= 1e-6
    for key in ref_opt.state[q]:
        assert _rel(opt.state[p][key], ref_opt.state[q][key]) <= 1e-6, key


def test_adamw_groups_scheduler_closure(device):
    """Two param groups (own lr, own decay), a scheduler changing lr, the closure form."""
    ours, ref = _mlp(device), _mlp(device)

    def groups(m):
        return [
            {"params": [m[0].weight, m[2].weight], "weight_decay": 0.1},
            {"params": [m[0].bias, m[4].weight, m[4].bias], "lr": 3e-3, "weight_decay": 0.0},
        ]

    opt = tko.AdamW(groups(ours), lr=1e-2)
    ref_opt = torch.optim.AdamW(groups(ref), lr=1e-2, foreach=False)
    scheds = [torch.optim.lr_scheduler.StepLR(o, 4, 0.5) for o in (opt, ref_opt)]
    _train([(ours, opt), (ref, ref_opt)], device, 12, closure=True, schedulers=scheds)
    for p, q in zip(ours.parameters(), ref.parameters()):
        assert _rel(p, q) <= 1e-6
    assert opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"] == 1e-2 / 8


@pytest.mark.parametrize("cls", [tko.AdamW, tko.Muon])
def test_step_bumps_version_counters_as_torch_does(device, cls):
    """A step writes the parameters in place: autograd must see it (a graph that saved a
    parameter raises on backward, as with torch.optim), and so must caches keyed on the
    version, such as Float8Linear's weight codes."""
    w = torch.nn.Parameter(torch.randn(24, 40, device=device))
    w.grad = torch.randn_like(w)
    opt = cls([w], lr=1e-2)
    before = w._version
    x = torch.randn(3, 24, device=device, requires_grad=True)
    y = (x @ w).sum()  # saves w for x's gradient
    opt.step()
    assert w._version > before
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_adam_params_without_grads_and_empty(device):
    """A parameter without a gradient keeps its step count; an empty one steps; the set of
    parameters with gradients changing rebuilds the tables."""
    torch.manual_seed(0)
    shapes = [(5, 7), (0,), (300,), (3,)]
    ours = [torch.nn.Parameter(torch.randn(s, device=device)) for s in shapes]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    opt = tko.AdamW(ours, lr=1e-2)
    ref_opt = torch.optim.AdamW(ref, lr=1e-2, foreach=False)
    for it in range(8):
        for i, (p, q) in enumerate(zip(ours, ref)):
            if i == 2 and it % 3 == 1:  # no gradient this step
                p.grad = q.grad = None
                continue
            g = torch.randn(p.shape, device=device)
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        ref_opt.step()
    for p, q in zip(ours, ref):
        if p.numel():
            assert _rel(p, q) <= 1e-6
        assert float(opt.state[p]["step"]) == float(ref_opt.state[q]["step"])
    assert float(opt.state[ours[2]]["step"]) == 5


def test_adam_zero_grad_keeps_buffers(device):
    """zero_grad(set_to_none=False): the same gradient tensors every step (no table update)."""
    ours, ref = _mlp(device), _mlp(device)
    opt, ref_opt = tko.Adam(ours.parameters(), lr=1e-2), torch.optim.Adam(ref.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(3)  # host: one draw sequence on every device
    for _ in range(5):
        x = torch.randn(4, 13, generator=gen).to(device)
        for m, o in ((ours, opt), (ref, ref_opt)):
            o.zero_grad(set_to_none=False)
            m(x).square().mean().backward()
            o.step()
    for p, q in zip(ours.parameters(), ref.parameters()):
        assert _rel(p, q) <= 1e-6


def test_adam_grad_in_other_layout_is_copied(device):
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(6, 4, device=device))
    q = torch.nn.Parameter(p.detach().clone())
    opt, ref_opt = tko.Adam([p], lr=1e-2), torch.optim.Adam([q], lr=1e-2)
    g = torch.randn(4, 6, device=device).t()  # column-major gradient of a row-major param
    p.grad, q.grad = g, g.clone()
    LAYOUT_COPIES.reset()
    opt.step()
    ref_opt.step()
    assert LAYOUT_COPIES.reset() == 1
    assert _rel(p, q) <= 1e-6


def test_adam_lr_tensor_capturable(device):
    """A tensor lr on the parameters' device is read on the device, so changing it in place
    (as a captured schedule does) changes the next step."""
    ours, ref = _mlp(device), _mlp(device)
    lr = torch.tensor(1e-2, device=device)
    opt = tko.AdamW(ours.parameters(), lr=lr, capturable=True, nonfinite="skip")
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, foreach=False)
    _train([(ours, opt), (ref, ref_opt)], device, 3)
    lr.fill_(3e-3)
    for g in ref_opt.param_groups:
        g["lr"] = 3e-3
    _train([(ours, opt), (ref, ref_opt)], device, 3, seed=1)
    for p, q in zip(ours.parameters(), ref.parameters()):
        assert _rel(p, q) <= 1e-6


# ---- 16-bit parameters ---------------------------------------------------------------------


def _grads(shape, steps, device, dtype):
    gen = torch.Generator().manual_seed(7)  # host: one draw sequence on every device
    return [torch.randn(shape, generator=gen).to(device=device, dtype=dtype) for _ in range(steps)]


def _run(opt, p, grads):
    for g in grads:
        p.grad = g.clone()
        opt.step()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_master_weights_follow_float32(device, dtype):
    """With master weights, the float32 copy follows float32 AdamW on the same gradients to
    1e-6, and the parameter is that copy rounded."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(37, 11, device=device).to(dtype))
    q = torch.nn.Parameter(p.detach().float())
    grads = _grads(p.shape, 10, device, dtype)
    opt = tko.AdamW([p], lr=1e-3, master_weights=True)
    ref_opt = torch.optim.AdamW([q], lr=1e-3, foreach=False)
    _run(opt, p, grads)
    _run(ref_opt, q, [g.float() for g in grads])
    master = opt.state[p]["master_param"]
    assert master.dtype == torch.float32 and opt.state[p]["exp_avg"].dtype == torch.float32
    assert _rel(master, q) <= 1e-6
    ulp = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-10
    assert ((p.float() - master).abs() <= ulp * master.abs()).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_params_no_worse_than_torch(device, dtype):
    """Without master weights: moments in the parameter's dtype (torch's layout), the update
    in float32 and rounded once. Against float32 AdamW on the same gradients, no further off
    than torch's own 16-bit AdamW (which rounds after every operation): both are dominated by
    rounding the parameter every step, so within 1.25x."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(64, 9, device=device).to(dtype))
    q = torch.nn.Parameter(p.detach().clone())
    r = torch.nn.Parameter(p.detach().float())
    grads = _grads(p.shape, 10, device, dtype)
    opt = tko.AdamW([p], lr=1e-2, eps=1e-6)
    _run(opt, p, grads)
    _run(torch.optim.AdamW([q], lr=1e-2, eps=1e-6, foreach=False), q, grads)
    _run(torch.optim.AdamW([r], lr=1e-2, eps=1e-6, foreach=False), r, [g.float() for g in grads])
    assert opt.state[p]["exp_avg"].dtype == dtype
    assert torch.isfinite(p).all()
    assert _rel(p, r) <= 1.25 * _rel(q, r)


def test_stochastic_rounding_is_unbiased(device):
    """Updates far below half a bfloat16 unit: rounding to nearest never moves the parameter,
    stochastic rounding moves it by the right amount on average."""
    n, steps, lr = 8192, 10, 1e-4
    grads = [torch.ones(n, device=device, dtype=torch.bfloat16)] * steps
    p_sr = torch.nn.Parameter(torch.ones(n, device=device, dtype=torch.bfloat16))
    p_rn = torch.nn.Parameter(torch.ones(n, device=device, dtype=torch.bfloat16))
    _run(tko.Adam([p_sr], lr=lr, stochastic_rounding=True), p_sr, grads)
    _run(tko.Adam([p_rn], lr=lr), p_rn, grads)
    assert (p_rn == 1).all()
    exact = 1 - steps * lr  # Adam's first steps move each element by lr (constant gradient)
    spread = 2.0**-8 / 2 / n**0.5  # std of the mean of n roundings one unit apart, at most
    assert abs(p_sr.float().mean().item() - exact) < 6 * spread


# ---- state_dict both ways --------------------------------------------------------------------


def _copy_model(m):
    return copy.deepcopy(m)


@pytest.mark.parametrize("amsgrad", [False, True])
def test_state_dict_to_torch_and_back(device, amsgrad):
    """A state saved by tritonkit loads into torch.optim.AdamW and the reverse; the round
    trip keeps every bit: the next step is bit-identical to the uninterrupted one."""
    model = _mlp(device)
    opt = tko.AdamW(model.parameters(), lr=1e-2, amsgrad=amsgrad, weight_decay=0.1)
    _train([(model, opt)], device, 5)
    saved = copy.deepcopy(opt.state_dict())
    st = saved["state"][0]
    assert set(st) == {"step", "exp_avg", "exp_avg_sq"} | ({"max_exp_avg_sq"} if amsgrad else set())
    assert st["step"].device.type == "cpu" and st["step"].dtype == torch.float32

    # tritonkit -> torch: torch continues from our state as from its own (to 1e-6).
    torch_model = _copy_model(model)
    torch_opt = torch.optim.AdamW(torch_model.parameters(), lr=1e-2, amsgrad=amsgrad, foreach=False)
    torch_opt.load_state_dict(copy.deepcopy(saved))
    # torch -> tritonkit: a fresh optimizer loads torch's state dict.
    back_model = _copy_model(model)
    back = tko.AdamW(back_model.parameters(), lr=1e-2, amsgrad=amsgrad)
    back.load_state_dict(copy.deepcopy(torch_opt.state_dict()))
    _train([(model, opt), (torch_model, torch_opt), (back_model, back)], device, 1, seed=9)
    for p, q, r in zip(model.parameters(), torch_model.parameters(), back_model.parameters()):
        assert torch.equal(p, r)  # round trip through torch: bit-identical
        assert _rel(q, p) <= 1e-6
    assert float(back.state[next(back_model.parameters())]["step"]) == 6


def test_state_dict_from_torch_bit_identical(device):
    """torch -> tritonkit -> torch: torch's next step from the round-tripped state equals its
    next step from its own state, bit for bit."""
    model = _mlp(device)
    torch_opt = torch.optim.Adam(model.parameters(), lr=1e-2, foreach=False)
    _train([(model, torch_opt)], device, 4)
    ours_model = _copy_model(model)
    ours = tko.Adam(ours_model.parameters(), lr=1e-2)
    ours.load_state_dict(copy.deepcopy(torch_opt.state_dict()))
    again_model = _copy_model(model)
    again = torch.optim.Adam(again_model.parameters(), lr=1e-2, foreach=False)
    again.load_state_dict(copy.deepcopy(ours.state_dict()))
    _train([(model, torch_opt), (again_model, again), (ours_model, ours)], device, 1, seed=5)
    for p, q, r in zip(model.parameters(), again_model.parameters(), ours_model.parameters()):
        assert torch.equal(p, q)
        assert _rel(r, p) <= 1e-6


def test_master_weights_state_dict_round_trip(device):
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(50, device=device).to(torch.bfloat16))
    p2 = torch.nn.Parameter(p.detach().clone())
    grads = _grads(p.shape, 4, device, torch.bfloat16)
    opt = tko.AdamW([p], lr=1e-3, master_weights=True)
    _run(opt, p, grads[:3])
    opt2 = tko.AdamW([p2], lr=1e-3, master_weights=True)
    p2.data.copy_(p.data)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))
    assert opt2.state[p2]["master_param"].dtype == torch.float32
    _run(opt, p, grads[3:])
    _run(opt2, p2, grads[3:])
    assert torch.equal(opt.state[p]["master_param"], opt2.state[p2]["master_param"])
    assert torch.equal(p, p2)


# ---- non-finite gradients --------------------------------------------------------------------


def _snapshot(opt, params):
    return [p.detach().clone() for p in params], copy.deepcopy(opt.state_dict()["state"])


def _assert_unchanged(opt, params, snap):
    before, state = snap
    for p, b in zip(params, before):
        assert torch.equal(p, b)
    now = opt.state_dict()["state"]
    for i, st in state.items():
        for key, value in st.items():
            assert torch.equal(now[i][key], value), key


def _poison_grad(model, value):
    model.zero_grad()
    model(torch.randn(4, 13, device=next(model.parameters()).device)).square().mean().backward()
    model[2].weight.grad[3, 5] = value


@pytest.mark.parametrize(
    ("cls", "value"),
    [
        (tko.AdamW, float("nan")),
        (tko.AdamW, float("inf")),
        (tko.Muon, float("nan")),
        pytest.param(tko.Muon, float("inf"), marks=SLOW),
    ],
    ids=str,
)
def test_nonfinite_raise_leaves_everything(device, cls, value):
    model = _mlp(device)
    params = [p for p in model.parameters() if cls is not tko.Muon or p.dim() == 2]
    opt = cls(params, lr=1e-2, nonfinite="raise")
    _train([(model, opt)], device, 2)
    snap = _snapshot(opt, params)
    _poison_grad(model, value)
    with pytest.raises(tko.NonFiniteGradError, match=r"param_groups\[0\]\['params'\]\[\d\]"):
        opt.step()
    _assert_unchanged(opt, params, snap)
    assert opt.nonfinite_steps.item() == 1  # refused steps are counted too
    _train([(model, opt)], device, 1)  # and the next finite step runs
    assert not torch.equal(params[0], snap[0][0])


# ---- no host sync in a default step ------------------------------------------------------------

_SRC = str(Path(tko.__file__).resolve().parents[1])  # .../src/tritonkit
# Tensor methods that read a device value back to the host (each waits for the GPU).
_READBACKS = (
    "item", "tolist", "cpu", "numpy", "nonzero", "__bool__", "__float__", "__int__",
    "__index__", "__array__",
)  # fmt: skip


@contextlib.contextmanager
def _host_syncs():
    """The calls that read a tensor back to the host, or wait for the device, made from
    tritonkit's own code while the block runs: a list of "name at file:line" (the caller's
    frame; Triton's interpreter, which copies tensors to run kernels, is not tritonkit)."""
    calls = []

    def guard(name, original):
        def wrapper(*args, **kwargs):
            caller = sys._getframe(1)
            if caller.f_code.co_filename.startswith(_SRC):
                calls.append(f"{name} at {caller.f_code.co_filename}:{caller.f_lineno}")
            return original(*args, **kwargs)

        return wrapper

    with pytest.MonkeyPatch.context() as mp:
        for name in _READBACKS:
            mp.setattr(torch.Tensor, name, guard(name, getattr(torch.Tensor, name)))
        mp.setattr(torch.cuda, "synchronize", guard("synchronize", torch.cuda.synchronize))
        for cls in (torch.cuda.Stream, torch.cuda.Event):
            mp.setattr(cls, "synchronize", guard("synchronize", cls.synchronize))
        yield calls


@contextlib.contextmanager
def _no_host_sync():
    """Fail on a host sync inside the block: by the code path everywhere (``_host_syncs``),
    and on a GPU by CUDA itself (``set_sync_debug_mode("error")``: any synchronizing call,
    a blocking copy to or from the device included)."""
    cuda = torch.cuda.is_available()
    with _host_syncs() as calls:
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode(0)
    assert not calls, f"host syncs from tritonkit: {calls}"


def _muonw_groups(model):
    return tko.muon_param_groups(model, lr=2e-2)


# Every optimizer class at its defaults, as a user builds it for the _mlp model.
OPTIMIZERS = {
    "Adam": lambda m: tko.Adam(m.parameters(), lr=1e-2),
    "AdamW": lambda m: tko.AdamW(m.parameters(), lr=1e-2),
    "Muon": lambda m: tko.Muon([p for p in m.parameters() if p.dim() == 2], lr=2e-2),
    "MuonW": lambda m: tko.MuonW(m.parameters(), lr=1e-2),
}


def _backward(model, x, poison=None):
    model.zero_grad(set_to_none=True)  # new gradient tensors: their addresses change
    model(x).square().mean().backward()
    if poison is not None:
        model[2].weight.grad[3, 5] = poison


def _cases(fast):
    """(optimizer, clipped) for every class, with and without a clip; the fast tier runs
    ``fast`` (Muon's Newton-Schulz products are slow under the interpreter)."""
    return [
        pytest.param(name, clip, marks=() if (name, clip) in fast else SLOW)
        for name in OPTIMIZERS
        for clip in (False, True)
    ]


@pytest.mark.parametrize(
    ("name", "clip"),
    _cases({("Adam", False), ("Adam", True), ("AdamW", False), ("AdamW", True),
            ("Muon", False), ("MuonW", True)}),
)  # fmt: skip
def test_default_step_never_syncs(device, name, clip):
    """The first step (tables built), later steps with reallocated gradients, a step that
    meets a NaN (skipped on the device) and ``clip_grad_norm_`` fused into the step: no call
    from tritonkit reads a tensor back or waits for the device, and on a GPU CUDA sees no
    synchronizing call. Then the counter and the flag read what happened."""
    model = _mlp(device)
    opt = OPTIMIZERS[name](model)
    gen = torch.Generator().manual_seed(0)  # host: one draw sequence on every device
    xs = [torch.randn(8, 13, generator=gen).to(device) for _ in range(4)]
    for k, x in enumerate(xs):
        _backward(model, x, float("nan") if k == 2 else None)
        with _no_host_sync():
            if clip:
                opt.clip_grad_norm_(0.5)
            opt.step()
    assert opt.nonfinite_steps.item() == 1
    assert opt.found_inf_flag.item() == 0  # the last step was finite
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_the_sync_check_sees_a_sync(device):
    """The checks above can fail: ``nonfinite="raise"`` reads the flag back (its documented
    host sync), and the guard says where."""
    model = _mlp(device)
    opt = tko.AdamW(model.parameters(), lr=1e-2, nonfinite="raise")
    _backward(model, torch.randn(8, 13, device=device))
    with _host_syncs() as calls:
        opt.step()
    assert calls and calls[0].startswith("item at ") and "_base.py" in calls[0], calls
    if torch.cuda.is_available():
        # CUDA's own check raises at the sync, before the code-path check reports it.
        with pytest.raises(RuntimeError, match="synchroniz"), _no_host_sync():
            opt.step()


@pytest.mark.parametrize(
    ("name", "clip"), _cases({("Adam", False), ("AdamW", True), ("MuonW", True)})
)
def test_nonfinite_skip_leaves_no_trace(device, name, clip):
    """At the defaults a step with a NaN or an infinity is skipped on the device, without a
    sync: parameters, every state tensor, step counts and gradients untouched; the counter
    grows by one and the flag is set. A twin that never saw that step ends bit-identical after
    the finite steps that follow."""
    model, twin = _mlp(device), _mlp(device)
    opt, twin_opt = OPTIMIZERS[name](model), OPTIMIZERS[name](twin)
    params = [p for group in opt.param_groups for p in group["params"]]
    gen = torch.Generator().manual_seed(1)  # host: one draw sequence on every device
    xs = [torch.randn(8, 13, generator=gen).to(device) for _ in range(4)]

    def step(m, o):
        if clip:
            o.clip_grad_norm_(0.5)
        o.step()

    for x in xs[:2]:
        for m, o in ((model, opt), (twin, twin_opt)):
            _backward(m, x)
            step(m, o)
    snap = _snapshot(opt, params)
    for k, bad in enumerate((float("nan"), float("-inf"))):
        _backward(model, xs[2], bad)
        grads = [p.grad.clone() for p in params]
        with _no_host_sync():
            step(model, opt)
        _assert_unchanged(opt, params, snap)
        for p, g in zip(params, grads):  # not unscaled, not clipped: not written at all
            assert _same_with_nan(p.grad, g)
        assert opt.nonfinite_steps.item() == k + 1
        assert opt.found_inf_flag.item() == 1
    for x in xs[2:]:
        for m, o in ((model, opt), (twin, twin_opt)):
            _backward(m, x)
            step(m, o)
    assert opt.nonfinite_steps.item() == 2 and twin_opt.nonfinite_steps.item() == 0
    assert opt.found_inf_flag.item() == 0
    for p, q in zip(model.parameters(), twin.parameters()):
        assert torch.equal(p, q)
    twin_params = [p for group in twin_opt.param_groups for p in group["params"]]
    for p, q in zip(params, twin_params):
        for key, value in twin_opt.state[q].items():
            assert torch.equal(opt.state[p][key], value), key


def _same_with_nan(a, b):
    return torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(
        a.nan_to_num(0.0), b.nan_to_num(0.0)
    )


def test_nonfinite_propagate_as_torch(device):
    ours, ref = _mlp(device), _mlp(device)
    opt = tko.Adam(ours.parameters(), lr=1e-2, nonfinite="propagate")
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2, foreach=False)
    for m, o in ((ours, opt), (ref, ref_opt)):
        torch.manual_seed(4)
        _poison_grad(m, float("inf"))
        o.step()
    for p, q in zip(ours.parameters(), ref.parameters()):
        assert torch.equal(torch.isnan(p), torch.isnan(q))
        assert torch.equal(torch.isinf(p), torch.isinf(q))


def test_grad_scaler_protocol(device):
    """torch.amp.GradScaler hands its found_inf and scale to the step (as to torch's fused
    AdamW): an overflowing step is skipped on the device, a finite one unscales in the kernel."""
    ours, ref = _mlp(device), _mlp(device)
    opt = tko.AdamW(ours.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, foreach=False)
    scalers = [torch.amp.GradScaler(device.type, init_scale=1024.0) for _ in range(2)]
    gen = torch.Generator().manual_seed(0)  # host: one draw sequence on every device
    for it in range(4):
        x = torch.randn(8, 13, generator=gen).to(device)
        for m, o, s in ((ours, opt, scalers[0]), (ref, ref_opt, scalers[1])):
            o.zero_grad()
            s.scale(m(x).square().mean()).backward()
            if it == 2:  # an overflow: the step must be skipped and the scale lowered
                m[2].weight.grad[0, 0] = float("inf")
            s.step(o)
            s.update()
    assert scalers[0].get_scale() == scalers[1].get_scale() == 512.0
    for p, q in zip(ours.parameters(), ref.parameters()):
        assert _rel(p, q) <= 1e-6
    assert float(opt.state[next(ours.parameters())]["step"]) == 3


# ---- Muon ------------------------------------------------------------------------------------


def _ns_ref(g):
    return _zeropower_via_newtonschulz(g, NS_COEFFICIENTS, 5, 1e-7)


@pytest.mark.parametrize(
    "shape",
    [(24, 40), (40, 24), pytest.param((33, 33), marks=SLOW), pytest.param((5, 100), marks=SLOW)],
)
def test_newton_schulz_matches_torch(device, shape):
    """Rounded where PyTorch rounds (bfloat16 after every addmm), the iterates follow
    torch.optim.Muon's to a few bfloat16 units, far inside either's error against float64."""
    g = torch.randn(3, *shape, device=device)
    ours = newton_schulz(g).float()
    ref = torch.stack([_ns_ref(x) for x in g]).float()
    assert ours.dtype == torch.float32 and newton_schulz(g).dtype == torch.bfloat16
    assert ((ours - ref).norm() / ref.norm()).item() < 5e-3


@pytest.mark.parametrize("shape", [(2, 24, 40), (2, 40, 24)])
def test_newton_schulz_tma_path_matches_pointer_path(device, shape):
    """The TMA-descriptor kernel (operands read transposed in the tile where needed) computes
    what the pointer kernel does."""
    import dataclasses

    from tritonkit.ops.optim.config import default_ns_config

    g = torch.randn(shape, device=device)
    pointer = dataclasses.replace(default_ns_config(), tma=False)
    tma = dataclasses.replace(pointer, tma=True)
    assert torch.equal(newton_schulz(g, config=tma), newton_schulz(g, config=pointer))


def test_newton_schulz_gram_is_symmetric(device):
    """The symmetric products store each tile and its mirror: A is exactly symmetric."""
    from tritonkit.ops.optim.config import default_ns_config
    from tritonkit.ops.optim.plan import NSWorkspace, ns_gemm

    ws = NSWorkspace(2, 70, 45, device)
    ws.x.copy_(torch.randn(2, 70, 45, device=device) / 20)
    xs = ws.x.transpose(1, 2)  # tall: the Gram matrix is X^T X (45 x 45)
    ns_gemm(xs, xs.transpose(1, 2), None, ws.gram, 1.0, 0.0, True, default_ns_config())
    assert torch.equal(ws.gram, ws.gram.transpose(1, 2))
    ref = (xs.float() @ xs.transpose(1, 2).float()).bfloat16()
    assert ((ws.gram.float() - ref.float()).abs() <= 2**-7 * ref.float().abs() + 1e-6).all()


def test_default_configs_come_from_the_shipped_table():
    """The H200 table (tuned/nvidia-h200/optim.json, written by
    experiments/gpu_optim_defaults.py --ship) holds its sweep's winners under the keys the
    optimizers look up: Muon's best Newton-Schulz config at 8 x 4096 x 4096, 1024-element
    chunks for float32; what no table holds takes the heuristic."""
    from tritonkit import _hardware, _tuning
    from tritonkit.ops.optim.config import (
        CHUNK_CANDIDATES,
        CHUNKS_KERNEL,
        NS_CANDIDATES,
        NS_KERNEL,
        ChunkConfig,
        NSConfig,
        chunks_key,
        heuristic_chunks,
        ns_key,
    )

    machine = ("NVIDIA H200", "3.6.0")
    _hardware.set_active(_hardware.match(machine[0]))  # entry keys name the GPU's profile
    try:
        ns = _tuning.shipped_lookup(NS_KERNEL, ns_key(8, 4096, 4096), machine)
        chunks = _tuning.shipped_lookup(CHUNKS_KERNEL, chunks_key(torch.float32), machine)
        other = _tuning.shipped_lookup(NS_KERNEL, ns_key(8, 4096, 4000), machine)
    finally:
        _hardware.set_active(None)
    assert NSConfig.from_tuning(ns) == NSConfig(tma=True, block_n=256)
    assert ns in [c.tuning() for c in NS_CANDIDATES]  # a row the optimizer accepts
    assert ChunkConfig.from_tuning(chunks) == ChunkConfig(1024, 4)
    assert chunks in [c.tuning() for c in CHUNK_CANDIDATES]
    assert other is None
    assert heuristic_chunks(torch.float32) == ChunkConfig(1024, 4)
    assert heuristic_chunks(torch.bfloat16) == ChunkConfig(2048, 4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the device's own choice")
def test_default_ns_config_on_this_gpu():
    """The default Muon at 8 x 4096 x 4096 runs this GPU's shipped config where its table has
    one (the H200's, the H100's), else the heuristic's: the TMA kernel on Hopper, elsewhere
    the pointer kernel."""
    from tritonkit import _tuning
    from tritonkit.ops.optim.config import (
        DEFAULT_NS,
        HOPPER_WIDE_NS,
        NS_CANDIDATES,
        NS_KERNEL,
        NSConfig,
        choose_ns_config,
        ns_key,
        tma_device,
    )

    dev = torch.device("cuda")
    chosen = choose_ns_config(8, 4096, 4096, dev)
    with torch.cuda.device(dev):
        row = _tuning.shipped_lookup(NS_KERNEL, ns_key(8, 4096, 4096))
    if row is not None and row in [c.tuning() for c in NS_CANDIDATES]:
        assert chosen == NSConfig.from_tuning(row)
    else:
        assert chosen == (HOPPER_WIDE_NS if tma_device(dev) else DEFAULT_NS)
    model = _mlp(dev)
    opt = tko.Muon([p for p in model.parameters() if p.dim() == 2])
    _backward(model, torch.randn(8, 13, device=dev))
    opt.step()
    plan = opt._plans[0][1][0]
    assert plan.ns_configs == [choose_ns_config(1, *s, dev) for s in ((40, 13), (24, 40), (3, 24))]


def _matrices(device, seed=2):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(24, 40, bias=False),
        torch.nn.Tanh(),
        torch.nn.Linear(40, 24, bias=False),
        torch.nn.Tanh(),
        torch.nn.Linear(24, 40, bias=False),  # the same shape as the first: one batch
    ).to(device)


MUON_OPTIONS = [
    {},
    {"nesterov": False, "adjust_lr_fn": "match_rms_adamw", "weight_decay": 0.0},
    {"momentum": 0.9, "weight_decay": 0.2, "adjust_lr_fn": "original"},
]


@pytest.mark.parametrize(
    "options", [MUON_OPTIONS[0], *(pytest.param(o, marks=SLOW) for o in MUON_OPTIONS[1:])], ids=str
)
def test_muon_one_step_matches_torch(device, options):
    """Same parameters, same gradient: one step differs from torch.optim.Muon's by at most a
    bfloat16 unit of the update, where the two roundings of a product fall apart."""
    torch.manual_seed(0)
    for shape in [(40, 24), (24, 40), (33, 33)]:
        p = torch.nn.Parameter(torch.randn(shape, device=device))
        q = torch.nn.Parameter(p.detach().clone())
        opt, ref_opt = tko.Muon([p], lr=2e-2, **options), torch.optim.Muon([q], lr=2e-2, **options)
        for _ in range(3):
            g = torch.randn(shape, device=device)
            p.grad, q.grad = g.clone(), g.clone()
            opt.step()
            ref_opt.step()
            fn = options.get("adjust_lr_fn")
            ratio = (
                0.2 * max(shape) ** 0.5
                if fn == "match_rms_adamw"
                else (max(1.0, shape[0] / shape[1]) ** 0.5)
            )
            # two bfloat16 units of an update entry in [1, 2) (entries of O are below 2)
            assert (p - q).abs().max().item() <= 2e-2 * ratio * 2**-6

            q.data.copy_(p.data)
        buf, ref_buf = opt.state[p]["momentum_buffer"], ref_opt.state[q]["momentum_buffer"]
        assert _rel(buf, ref_buf) <= 1e-6


@SLOW
@pytest.mark.parametrize("options", MUON_OPTIONS, ids=str)
def test_muon_matches_torch_20_steps(device, options):
    ours, ref = _matrices(device), _matrices(device)
    opt = tko.Muon(ours.parameters(), lr=5e-3, **options)
    ref_opt = torch.optim.Muon(ref.parameters(), lr=5e-3, **options)
    gen = torch.Generator().manual_seed(0)  # host: one draw sequence on every device
    for _ in range(20):
        x = torch.randn(8, 24, generator=gen).to(device)
        for m, o in ((ours, opt), (ref, ref_opt)):
            o.zero_grad()
            m(x).square().mean().backward()
            o.step()
    for p, q in zip(ours.parameters(), ref.parameters()):
        assert _rel(p, q) <= 1e-2
    # state_dict: torch.optim.Muon's layout, both ways
    assert set(opt.state_dict()["state"][0]) == {"momentum_buffer"}
    torch_again = torch.optim.Muon(_matrices(device).parameters(), lr=5e-3, **options)
    torch_again.load_state_dict(copy.deepcopy(opt.state_dict()))
    back = tko.Muon(_matrices(device).parameters(), lr=5e-3, **options)
    back.load_state_dict(copy.deepcopy(torch_again.state_dict()))
    for st, st2 in zip(opt.state.values(), back.state.values()):
        assert torch.equal(st["momentum_buffer"], st2["momentum_buffer"])


def test_muon_conv_weights_flattened(device):
    """A conv weight (out, in, kh, kw) is the matrix (out, in * kh * kw)."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(8, 3, 3, 3, device=device))
    q = torch.nn.Parameter(w.detach().reshape(8, 27).clone())
    g = torch.randn(8, 3, 3, 3, device=device)
    w.grad, q.grad = g.clone(), g.reshape(8, 27).clone()
    tko.Muon([w], lr=2e-2).step()
    torch.optim.Muon([q], lr=2e-2).step()
    assert (w.reshape(8, 27) - q).abs().max().item() <= 2e-2 * 2**-7 * 2


def test_muonw_split_and_steps(device):
    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(50, 16)
            self.up = torch.nn.Linear(16, 32)
            self.norm = torch.nn.LayerNorm(32)
            self.lm_head = torch.nn.Linear(32, 50, bias=False)

        def forward(self, x):
            return self.lm_head(self.norm(self.up(self.emb(x))))

    torch.manual_seed(0)
    model = LM().to(device)
    groups = tko.muon_param_groups(model, lr=2e-2)
    assert groups[0]["use_muon"] and groups[0]["params"] == [model.up.weight]
    adam_ids = {id(p) for p in groups[1]["params"]}
    assert not groups[1]["use_muon"]
    assert id(model.emb.weight) in adam_ids and id(model.lm_head.weight) in adam_ids
    ref = copy.deepcopy(model)
    opt = tko.MuonW(groups, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8)
    muon_ref = torch.optim.Muon(
        [ref.up.weight], lr=2e-2, weight_decay=0.1, adjust_lr_fn="match_rms_adamw"
    )
    rest = [p for n, p in ref.named_parameters() if n != "up.weight"]
    adam_ref = torch.optim.AdamW(rest, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8)
    for _ in range(3):
        x = torch.randint(0, 50, (4, 7), device=device)
        for m, opts in ((model, [opt]), (ref, [muon_ref, adam_ref])):
            for o in opts:
                o.zero_grad()
            torch.nn.functional.cross_entropy(m(x).flatten(0, 1), x.flatten()).backward()
            for o in opts:
                o.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert _rel(p, q) <= (1e-2 if name == "up.weight" else 1e-6), name


# ---- argument checks -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"lr": -1e-3}, "lr"),
        ({"betas": (1.0, 0.999)}, r"betas\[0\]"),
        ({"betas": (0.9, -0.1)}, r"betas\[1\]"),
        ({"eps": 0.0}, "eps"),
        ({"weight_decay": -0.1}, "weight_decay"),
        ({"nonfinite": "ignore"}, "nonfinite"),
        ({"master_weights": True, "stochastic_rounding": True}, "stochastic_rounding"),
        ({"capturable": True, "nonfinite": "raise"}, "capturable"),
        ({"differentiable": True}, "differentiable"),
    ],
)
def test_adam_bad_hyperparameters(device, kwargs, name):
    p = torch.nn.Parameter(torch.zeros(3, device=device))
    with pytest.raises(ValueError, match=name):
        tko.AdamW([p], **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"momentum": 1.5}, "momentum"),
        ({"ns_steps": 100}, "ns_steps"),
        ({"adjust_lr_fn": "rms"}, "adjust_lr_fn"),
        ({"eps": -1.0}, "eps"),
        ({"lr": -1.0}, "lr"),
    ],
)
def test_muon_bad_hyperparameters(device, kwargs, name):
    p = torch.nn.Parameter(torch.zeros(3, 4, device=device))
    with pytest.raises(ValueError, match=name):
        tko.Muon([p], **kwargs)


def test_bad_parameters(device, monkeypatch):
    with pytest.raises(TypeError, match=r"params'\]\[1\].*int64"):
        tko.Adam(
            [
                torch.nn.Parameter(torch.zeros(2, device=device)),
                torch.zeros(2, dtype=torch.int64, device=device),
            ]
        )
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        tko.Muon([torch.nn.Parameter(torch.zeros(3, device=device))])
    with pytest.raises(ValueError, match="use_muon"):
        tko.MuonW([{"params": [torch.nn.Parameter(torch.zeros(3, 3, device=device))]}])
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # a CPU tensor without the interpreter
    with pytest.raises(TypeError, match="must be on a CUDA device, got cpu"):
        tko.AdamW([torch.nn.Parameter(torch.zeros(3))])  # host: the CPU tensor is what is refused


def test_bad_gradient(device):
    p = torch.nn.Parameter(torch.zeros(3, 4, device=device))
    opt = tko.Adam([p])
    p.grad = torch.zeros(3, 4, device=device).to_sparse()
    with pytest.raises(TypeError, match="sparse"):
        opt.step()


# ---- workbench specs -------------------------------------------------------------------------


def test_adam_step_functional(device):
    """The functional form updates param and moments in place, as torch's functional Adam."""
    torch.manual_seed(0)
    p, g, m = (torch.randn(300, device=device) for _ in range(3))
    v = torch.rand(300, device=device)
    q, m2, v2 = p.clone(), m.clone(), v.clone()
    g_before = g.clone()
    adam_step(p, g, m, v, step=4, lr=1e-2, weight_decay=0.1)
    assert torch.equal(g, g_before)
    torch.optim._functional.adam(
        [q], [g], [m2], [v2], [], [torch.tensor(3.0)],  # host: torch's steps
        amsgrad=False, beta1=0.9, beta2=0.999, lr=1e-2, weight_decay=0.1, eps=1e-8,
        maximize=False, foreach=False, capturable=False, differentiable=False, fused=None,
        grad_scale=None, found_inf=None, has_complex=False, decoupled_weight_decay=True,
    )  # fmt: skip
    for ours, theirs in zip((p, m, v), (q, m2, v2)):
        assert _rel(ours, theirs) <= 1e-6


@SLOW
def test_spec_adam_step(device):
    assert_spec_passes("adam_step", device)


@pytest.mark.slow
def test_spec_newton_schulz(device):
    assert_spec_passes("newton_schulz", device)
