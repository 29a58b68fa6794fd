"""The shared launch path's bound launches (``launch.Bound``), which the GPU takes on every
planned call: checked here with a stand-in kernel and compiled launcher, since the direct path
needs a GPU (the interpreter always takes Triton's own launcher)."""

import ctypes
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl

from tritonkit.ops._core import early_launch as E
from tritonkit.ops._core import launch as L
from tritonkit.ops._core.plan import PLANS


class _Kernel:
    """What Bound uses of a Kernel: ``_hooked``, ``_launch`` and ``stats``."""

    def __init__(self, entry: object) -> None:
        self.entry, self.launched = entry, []
        self.stats = {"bound": 0, "direct": 0, "triton": 0}

    def _hooked(self) -> bool:
        return False

    def _launch(self, grid, args, meta):
        self.launched.append(args)
        # As the binder's bound values: every parameter, constexprs included, in order.
        return self.entry, [*args, *meta.values()]


@pytest.fixture
def direct(monkeypatch):
    """The compiled launcher's calls (grid, values), on a stand-in current device 0."""
    calls = []
    monkeypatch.setattr(L, "_direct", lambda entry, grid, device, values: calls.append(values))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return calls


def test_bound_resolves_once_then_substitutes_tensors(direct):
    kernel = _Kernel(entry=object())
    a, b = torch.randn(8), torch.randn(8)
    bound = L.Bound(kernel, (4,), (a, None, 5, b), {"BLOCK": 16})
    assert bound.slots == (0, 3) and kernel.launched == []  # nothing launched by bind
    bound(a, b)
    assert len(kernel.launched) == 1 and kernel.launched[0][0] is a
    # No tensor outlives the call that resolved the entry.
    assert not any(isinstance(v, torch.Tensor) for v in bound._values)
    c, d = torch.randn(8), torch.randn(8)
    bound(c, d)
    assert len(kernel.launched) == 1 and kernel.stats["bound"] == 1
    (values,) = direct
    assert values[0] is c and values[1] is None and values[2] == 5 and values[3] is d
    assert values[4] == 16
    assert not any(isinstance(v, torch.Tensor) for v in bound._values)


def test_bound_takes_the_full_launch_for_another_specialization(direct):
    kernel = _Kernel(entry=object())
    a, b = torch.randn(8), torch.randn(8)
    bound = L.Bound(kernel, (1,), (a, b), {})
    bound(a, b)
    bound(a.half(), b)  # another dtype: another compiled kernel
    assert len(kernel.launched) == 2 and direct == []
    bound(a, b)
    off = torch.randn(9)[1:]  # 4 bytes past a 16-byte boundary: another specialization
    assert off.data_ptr() % 16
    bound(a, off)
    assert len(kernel.launched) == 3 and len(direct) == 1


def test_bound_takes_the_full_launch_while_launches_are_deferred(direct, monkeypatch):
    kernel = _Kernel(entry=object())
    a = torch.randn(4)
    bound = L.Bound(kernel, (1,), (a,), {})
    bound(a)
    monkeypatch.setattr(L.PIPE, "pending", ["a deferred launch"])
    bound(a)  # not ahead of it: through Kernel._launch, which defers it or flushes first
    assert len(kernel.launched) == 2 and direct == []
    monkeypatch.setattr(L.PIPE, "pending", None)
    bound(a)
    assert len(kernel.launched) == 2 and len(direct) == 1


def test_bound_without_a_direct_entry_always_launches_fully(direct):
    kernel = _Kernel(entry=None)  # the interpreter, hooks, or a kernel with profile scratch
    a = torch.randn(4)
    bound = L.Bound(kernel, (1,), (a,), {})
    for _ in range(3):
        bound(a)
    assert len(kernel.launched) == 3 and direct == []


# ---- the early launch: a new specialization's first launches before its C launcher is built ---


class _FakeCuda:
    """The driver calls ``_EarlyLaunch`` makes, recorded: each launch's grid, block, shared
    memory, stream and the bytes of every parameter, as cuLaunchKernel would read them."""

    def __init__(self, sizes, current=0x1000, status=0, pointer_status=0):
        self.sizes, self.launches, self.retained = sizes, [], []
        self.current, self.status, self.pointer_status = current, status, pointer_status

    def ctx_get_current(self, out):
        out._obj.value = self.current
        return 0

    def device_get(self, out, ordinal):
        out._obj.value = ordinal
        return 0

    def primary_ctx_retain(self, out, dev):
        self.retained.append(dev)
        out._obj.value = 0x2000
        return 0

    def ctx_set_current(self, ctx):
        self.current = ctx.value
        return 0

    def pointer_attribute(self, out, attribute, ptr):
        assert attribute == E._CU_POINTER_ATTRIBUTE_DEVICE_POINTER
        out._obj.value = ptr.value
        return self.pointer_status

    def launch(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        raw = [ctypes.string_at(params[i], n) for i, n in enumerate(self.sizes)]
        self.launches.append((function, (gx, gy, gz), (bx, by, bz), shared, stream, raw, extra))
        return self.status

    check = E._LibCuda.check
    error_string = staticmethod(lambda code, out: 0)


@pytest.fixture
def fake_cuda(monkeypatch):
    def make(sizes, **kw):
        cuda = _FakeCuda(sizes, **kw)
        monkeypatch.setattr(E, "_LIBCUDA", [cuda])
        return cuda

    return make


def _bits(value, dtype):  # host: the bytes of one value stored in ``dtype`` (round to nearest)
    return torch.tensor([value], dtype=torch.float64).to(dtype).view(torch.uint8).numpy().tobytes()


# A signature with every kind of parameter the early path takes, and the arguments of a launch.
_TYPES = ("*fp32", "i32", "constexpr", "fp32", "bf16", "fp16", "i64", "i1", "u8", "fp64", "*bf16")


def _launch_args():
    x = torch.randn(8)  # host: only its address is passed
    return x, (x, -7, 64, 0.1, 1.0048828125, 0.333, 1 << 40, True, 200, 2.5, None)


def test_early_launch_packs_parameters_as_the_c_launcher(fake_cuda):
    cuda = fake_cuda([8, 4, 4, 2, 2, 8, 1, 1, 8, 8, 8, 8])
    packers = E._packers(_TYPES)
    assert packers[2] is None and packers[0] is E._pointer  # a constexpr is not passed
    x, args = _launch_args()
    E.EarlyLaunch(packers)(3, 2, 1, 77, 0xF00, False, False, 0x5000, None, (4, 1, 1024),
                            None, None, None, *args)  # fmt: skip
    ((function, grid, block, shared, stream, raw, extra),) = cuda.launches
    assert (function, grid, block, shared, stream, extra) == (0xF00, (3, 2, 1), (128, 1, 1),
                                                              1024, 77, None)  # fmt: skip
    expected = [
        x.data_ptr().to_bytes(8, "little"),
        (-7).to_bytes(4, "little", signed=True),
        _bits(0.1, torch.float32),  # the double narrowed by a C cast: round to nearest
        _bits(1.0, torch.float32)[2:],  # bf16: 1 + 2**-8 + 2**-10 truncated (nearest: 1.0078)
        _bits(0.333, torch.float16),  # fp16: round to nearest even
        (1 << 40).to_bytes(8, "little"),
        b"\x01",
        bytes([200]),
        _bits(2.5, torch.float64),
        bytes(8),  # a None pointer is null
        (0x5000).to_bytes(8, "little"),  # global scratch
        bytes(8),  # profile scratch: none
    ]
    assert raw == expected


def test_early_launch_skips_an_empty_grid_and_retains_a_context(fake_cuda):
    cuda = fake_cuda([8] * 3, current=0)  # a thread with no current context
    launch = E.EarlyLaunch(E._packers(("*fp32",)))
    launch(0, 4, 1, 0, 1, False, False, None, None, (1, 1, 0), None, None, None, None)
    assert cuda.launches == [] and cuda.retained == [0] and cuda.current == 0x2000
    calls = []
    hook = calls.append
    launch(1, 1, 1, 0, 1, False, False, None, None, (1, 1, 0), "meta", hook, hook, None)
    assert len(cuda.launches) == 1 and calls == ["meta", "meta"]


def test_early_launch_raises_as_the_c_launcher(fake_cuda):
    launch = E.EarlyLaunch(E._packers(("*fp32",)))
    fake_cuda([8] * 3, pointer_status=E._CUDA_ERROR_INVALID_VALUE)
    with pytest.raises(ValueError, match=r"Pointer argument \(at 0\) cannot be accessed"):
        launch(1, 1, 1, 0, 1, False, False, None, None, (1, 1, 0), None, None, None,
               torch.randn(2))  # fmt: skip
    fake_cuda([8] * 3, status=700)
    with pytest.raises(RuntimeError, match="Triton Error"):
        launch(1, 1, 1, 0, 1, False, False, None, None, (1, 1, 0), None, None, None, None)


@pytest.mark.parametrize(
    "types", [(("*fp32", "i32"),), ("tensordesc<fp16[64, 64]>",), ("nvTmaDesc",), ("i128",)]
)
def test_early_launch_declines_what_the_c_launcher_expands(types):
    assert E._packers(types) is None


class _Compiled:
    """What _Entry reads of a CompiledKernel, with Triton's launcher counted when built."""

    def __init__(self, types=("*fp32", "i32"), **md):
        fields = dict(num_warps=4, shared=0, num_ctas=1, global_scratch_size=0)
        fields.update(profile_scratch_size=0, launch_cooperative_grid=False, launch_pdl=False)
        fields.update(md)
        self.metadata = SimpleNamespace(**fields)
        self.packed_metadata = (fields["num_warps"], 1, fields["shared"])
        self.src = SimpleNamespace(signature=dict(enumerate(types)))
        self.name, self.kernel, self.function, self.runs = "k", b"cubin", 0xC0DE, 0

    @property
    def run(self):
        self.runs += 1
        return SimpleNamespace(launch="c-launcher")


@pytest.fixture
def fake_driver(monkeypatch, fake_cuda):
    """A CUDA driver whose module loads and launcher builds are recorded."""
    fake_cuda([8] * 4)
    built = []
    utils = SimpleNamespace(
        get_device_properties=lambda device: {"max_shared_mem": 1 << 17},
        load_binary=lambda name, kernel, shared, device: (1, 0xF00, 32, 0, 1024),
    )

    def launcher_cls(src, metadata):
        built.append(src)
        if metadata.num_warps == 3:
            raise RuntimeError("no C compiler")
        return SimpleNamespace(launch="built-launcher")

    driver = SimpleNamespace(utils=utils, launcher_cls=launcher_cls)
    monkeypatch.setattr(E.internals, "triton_driver", lambda: driver)
    monkeypatch.setattr(E.internals, "triton_driver_is_cuda", lambda: True)
    monkeypatch.setattr(E, "BUILDS", E.LauncherBuilds())
    return built


def test_entry_launches_early_then_takes_the_built_launcher(fake_driver):
    compiled = _Compiled()
    entry = L._Entry(compiled, device=0)
    assert isinstance(entry.launch, E.EarlyLaunch) and entry.function == 0xF00
    assert compiled.runs == 0  # Triton's launcher was not built on the way
    assert E.BUILDS.wait(30) and entry.launch == "built-launcher" and E.BUILDS.built == 1
    failing = L._Entry(_Compiled(num_warps=3), device=0)
    assert E.BUILDS.wait(30) and isinstance(failing.launch, E.EarlyLaunch)  # still correct
    assert len(E.BUILDS.failed) == 1 and "no C compiler" in E.BUILDS.failed[0]


@pytest.mark.parametrize(
    "why",
    [
        {"launch_cooperative_grid": True},
        {"launch_pdl": True},
        {"shared": 1 << 18},  # over the device's limit: Triton raises OutOfResources itself
        {"num_warps": 64},  # more threads than the kernel can take: likewise
        {"types": ("tensordesc<fp16[64, 64]>",)},
        {"off": True},
    ],
)
def test_entry_builds_the_c_launcher_where_the_early_path_does_not_apply(fake_driver, why):
    was = E.enabled()
    E.enabled(not why.pop("off", False))
    try:
        compiled = _Compiled(**why)
        entry = L._Entry(compiled, device=0)
    finally:
        E.enabled(was)
    assert entry.launch == "c-launcher" and entry.function == 0xC0DE and compiled.runs == 1
    assert fake_driver == []


@triton.jit
def _affine(x_ptr, out_ptr, n, a, b, big, flag, BLOCK: tl.constexpr):
    """out = x * a + b + (big - 2**33) + flag, over n elements: one parameter of each kind the
    early launch packs (pointers, i32, fp32, i64, i1, a constexpr)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = x * a + b + (big - 8589934592).to(tl.float32)
    if flag:
        y += 1.0
    tl.store(out_ptr + offs, y, mask=mask)


@pytest.mark.gpu
def test_early_launch_computes_what_tritons_launcher_computes(device, monkeypatch):
    held = []
    builds = E.LauncherBuilds()
    monkeypatch.setattr(builds, "submit", lambda compiled, entry: held.append((compiled, entry)))
    monkeypatch.setattr(E, "BUILDS", builds)
    # A JIT function of its own: no compiled kernel whose C launcher Triton built already.
    kern = L.Kernel(triton.jit(_affine.fn))
    x = torch.randn(1000, device=device)
    for xs in (x, x[1:]):  # aligned, and 4 bytes past a 16-byte boundary
        n, outs = xs.numel(), []
        args = (n, 2.5, 7, (1 << 33) + 3, True)
        for i in range(2):  # early, then through Triton's C launcher once it is built
            out = torch.full_like(xs, float("nan"))
            kern[(triton.cdiv(n, 256),)](xs, out, *args, BLOCK=256)
            outs.append(out)
            if i == 0:  # the first launch was early, its C launcher's build queued
                ((compiled, entry),) = held
                assert isinstance(entry.launch, E.EarlyLaunch)
                held.clear()
                runner = L.internals.triton_driver().launcher_cls(compiled.src, compiled.metadata)
                entry.launch = runner.launch
        assert held == []
        ref = torch.full_like(xs, float("nan"))
        kern.fn[(triton.cdiv(n, 256),)](xs, ref, *args, BLOCK=256)  # Triton's own launch
        for out in outs:
            assert torch.equal(out, ref)
        torch.testing.assert_close(ref, xs * 2.5 + 11, rtol=1e-6, atol=1e-6)


# ---- pipelined first calls: compiles in parallel, launches in their order ----------------------


def _calls(device):
    """Operators whose launches interleave with allocations, fills, copies and other ATen ops:
    forward and backward, returning every output and gradient."""
    import tritonkit

    def grads(fn, *inputs):
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        out = fn(*leaves)
        outs = out if isinstance(out, tuple) else (out,)
        total = sum((o.float() * (1 + torch.arange(o.numel(), device=device).view_as(o) % 7)).sum()
                    for o in outs)  # fmt: skip
        total.backward()
        return [o.detach() for o in outs] + [t.grad for t in leaves]

    g = torch.Generator(device=device).manual_seed(5)

    def rand(*shape):
        return torch.randn(*shape, device=device, generator=g)

    def step(cls, *tensors):
        params = [torch.nn.Parameter(t.clone()) for t in tensors]
        for i, p in enumerate(params):
            p.grad = tensors[i].flip(0).clone()
        opt = cls(params, lr=1e-2)
        for _ in range(2):
            opt.step()
        return [p.detach() for p in params] + [
            t for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)
        ]

    x, w, b = rand(37, 130), rand(130), rand(130)
    target = torch.randint(0, 130, (37,), device=device, generator=g)
    q, k, v = rand(1, 2, 33, 16), rand(1, 2, 33, 16), rand(1, 2, 33, 16)
    lw, lb = rand(24, 130) / 8, rand(24)
    adam, muon = (rand(7, 13), rand(5)), (rand(16, 24),)
    return {
        "rms_norm": lambda: grads(lambda a, c: tritonkit.rms_norm(a, (130,), c), x, w),
        "layer_norm": lambda: grads(lambda a, c, d: tritonkit.layer_norm(a, (130,), c, d), x, w, b),
        "softmax": lambda: grads(lambda a: tritonkit.softmax(a, -1), x),
        "cross_entropy": lambda: grads(lambda a: tritonkit.cross_entropy(a, target), x),
        "linear_gelu": lambda: grads(
            lambda a, c, d: tritonkit.linear(a, c, d, activation="gelu_tanh"), x, lw, lb
        ),
        "attention": lambda: grads(
            lambda a, c, d: tritonkit.attention(a, c, d, is_causal=True), q, k, v
        ),
        "adamw": lambda: step(tritonkit.optim.AdamW, *adam),
        "muon": lambda: step(tritonkit.optim.Muon, *muon),
    }


_PIPELINED = ("rms_norm", "layer_norm", "softmax", "cross_entropy", "linear_gelu", "attention")


@pytest.mark.parametrize("op", [*_PIPELINED, "adamw", "muon"])
def test_pipelined_launches_give_the_same_bits(device, monkeypatch, op):
    call = _calls(device)[op]
    plain = call()
    monkeypatch.setattr(L, "_PIPELINE", True)  # opt-in (TRITONKIT_PIPELINE=1)
    monkeypatch.setattr(L.PIPE, "every", True)  # every launch in a region waits as a miss's does
    before = L.PIPE.deferred
    # Fresh plans, as a first call has: a plan's warm bound launches go straight to the
    # driver and are never deferred (on a GPU, linear's all are).
    with PLANS.isolated():
        piped = call()
    assert L.PIPE.deferred > before and L.PIPE.pending is None and L.PIPE.mode is None
    assert L.PIPE.depth == 0
    for a, b in zip(plain, piped, strict=True):
        assert torch.equal(a, b)


def test_pipelined_region_flushes_before_aten_ops_and_at_its_end(monkeypatch):
    order = []

    class _Fake:
        __name__ = "fake"

        def _triton(self, grid, args, meta):
            order.append(args[0])

    monkeypatch.setattr(L, "_PIPELINE", True)  # opt-in (TRITONKIT_PIPELINE=1)
    monkeypatch.setattr(L.PIPE, "every", True)
    with L.pipelined() as region:
        L.PIPE.pending = [(_Fake(), (1,), ("a",), {})]
        L.PIPE.mode = L._FlushMode()
        L.PIPE.mode.__enter__()
        y = torch.empty(3)  # host: an allocation enqueues nothing: no flush
        assert order == [] and L.PIPE.pending
        y.fill_(1.0)  # a fill writes memory: deferred launches go first
        assert order == ["a"] and not L.PIPE.pending
        L.PIPE.pending = [(_Fake(), (1,), ("b",), {})]
    assert order == ["a", "b"] and L.PIPE.mode is None and region.misses == 0
