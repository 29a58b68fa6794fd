"""Power and energy from NVML, through ctypes (libnvidia-ml.so.1; no pynvml dependency).

A candidate's energy is measured over back-to-back calls (nothing else queued, as a training
step makes them) for a given number of seconds: where the GPU has a total energy counter
(``nvmlDeviceGetTotalEnergyConsumption``, Volta and later, millijoules) its difference over the
loop, else the power (``nvmlDeviceGetPowerUsage``, milliwatts) sampled every few milliseconds
by a thread and integrated (trapezoids). Either way: watts = joules / seconds of the loop,
joules per call = joules / calls, and per watt: GFLOP/s per W = FLOPs per call / 1e9 / joules
per call (equivalently GFLOP per joule), GB/s per W likewise from the bytes. The counter
updates every few tens of milliseconds, so a loop should last at least half a second. The
figure includes the GPU's idle power over the loop (what the board draws, not one kernel's
share), and the source used is said with every figure.

Tests run the same code on the CPU with a fake library (any object with the NVML functions
used here, each writing through the ``ctypes.byref`` it is given).
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

NVML_SUCCESS = 0
LIBRARY = "libnvidia-ml.so.1"


class NvmlError(RuntimeError):
    """NVML is missing, or a call returned an error (its name and code in the message)."""


class Nvml:
    """One GPU's power and energy readings through the NVML C library.

    Args:
        lib: the loaded library (None: ``ctypes.CDLL(LIBRARY)``), or a fake with its functions.
        index: the NVML index of the GPU.
        pci_bus_id: the GPU's PCI bus id (as torch gives it); preferred over ``index`` where
            CUDA_VISIBLE_DEVICES renumbers the GPUs CUDA sees.
    """

    def __init__(self, lib: Any = None, index: int = 0, pci_bus_id: str | None = None) -> None:
        if lib is None:
            try:
                lib = ctypes.CDLL(LIBRARY)
            except OSError as exc:
                raise NvmlError(f"NVML not available: {exc}") from exc
        self.lib = lib
        self._call("nvmlInit_v2")
        self.handle = ctypes.c_void_p()
        if pci_bus_id:
            self._call(
                "nvmlDeviceGetHandleByPciBusId_v2", pci_bus_id.encode(), self._ref(self.handle)
            )
        else:
            self._call(
                "nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), self._ref(self.handle)
            )
        self.has_counter = self._energy_or_none() is not None

    @staticmethod
    def _ref(obj: Any) -> Any:
        return ctypes.byref(obj)

    def _call(self, name: str, *args: Any) -> None:
        fn = getattr(self.lib, name, None)
        if fn is None:
            raise NvmlError(f"NVML has no {name}")
        code = fn(*args)
        if code != NVML_SUCCESS:
            raise NvmlError(f"{name} returned NVML error {code}")

    def power_w(self) -> float:
        """The board's power draw now, in watts."""
        mw = ctypes.c_uint()
        self._call("nvmlDeviceGetPowerUsage", self.handle, self._ref(mw))
        return mw.value / 1e3

    def energy_j(self) -> float:
        """The total energy counter, in joules (since the driver loaded)."""
        mj = ctypes.c_ulonglong()
        self._call("nvmlDeviceGetTotalEnergyConsumption", self.handle, self._ref(mj))
        return mj.value / 1e3

    def _energy_or_none(self) -> float | None:
        try:
            return self.energy_j()
        except NvmlError:
            return None


class Meter:
    """Energy over a ``with`` block: ``joules``, ``seconds``, ``watts``, ``source``.

    Args:
        nvml: the readings.
        period_s: how often power is sampled where there is no energy counter.
        clock: the time source (tests pass a fake one).
    """

    def __init__(
        self, nvml: Nvml, period_s: float = 0.005, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.nvml, self.period_s, self.clock = nvml, period_s, clock
        self.samples: list[tuple[float, float]] = []
        self.joules = self.seconds = self.watts = 0.0
        self.source = "energy counter" if nvml.has_counter else "power samples"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.samples.append((self.clock(), self.nvml.power_w()))
            self._stop.wait(self.period_s)

    def __enter__(self) -> Meter:
        self._t0 = self.clock()
        if self.nvml.has_counter:
            self._e0 = self.nvml.energy_j()
        else:  # a first sample at the start: the integral covers the whole block
            self.samples.append((self._t0, self.nvml.power_w()))
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        t1 = self.clock()
        self.seconds = t1 - self._t0
        if self.nvml.has_counter:
            self.joules = self.nvml.energy_j() - self._e0
        else:
            self._stop.set()
            assert self._thread is not None
            self._thread.join()
            self.samples.append((t1, self.nvml.power_w()))
            self.joules = integrate(self.samples)
        self.watts = self.joules / self.seconds if self.seconds > 0 else 0.0


def integrate(samples: list[tuple[float, float]]) -> float:
    """Joules from (time s, power W) samples, by trapezoids."""
    return sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in itertools.pairwise(samples))


_NVML: dict[Any, Nvml | NvmlError] = {}


def nvml_for_current_device() -> Nvml:
    """The NVML handle of the current CUDA device (by PCI bus id), opened once."""
    import torch

    index = torch.cuda.current_device()
    if index not in _NVML:
        props = torch.cuda.get_device_properties(index)
        bus = None
        if hasattr(props, "pci_bus_id"):
            bus = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        try:
            _NVML[index] = Nvml(index=index, pci_bus_id=bus)
        except NvmlError:
            try:  # a bus id NVML spells otherwise: the index, right without renumbering
                _NVML[index] = Nvml(index=index)
            except NvmlError as exc:
                _NVML[index] = exc
    got = _NVML[index]
    if isinstance(got, NvmlError):
        raise got
    return got


def measure(
    fn: Callable[[], Any],
    seconds: float,
    *,
    nvml: Nvml | None = None,
    sync: Callable[[], None] | None = None,
    setup: Callable[[], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """Energy of ``fn`` called back to back for about ``seconds``.

    Args:
        fn: the call.
        seconds: how long the loop lasts (at least half a second for the energy counter).
        nvml: the readings (None: the current CUDA device's).
        sync: waits for the device (None: ``torch.cuda.synchronize``).
        setup: run before each call (an in-place operator's inputs put back); its cost counts.
        clock: the time source.

    Returns watts, joules_per_call, calls, seconds and source.
    """
    if sync is None:
        import torch

        sync = torch.cuda.synchronize
    nvml = nvml or nvml_for_current_device()
    fn()
    sync()
    t0 = clock()
    fn()
    sync()
    per_call = max(clock() - t0, 1e-7)
    # At most a hundredth of the loop (and 1,000 calls) between checks of the clock, and a wait
    # for the device after each chunk: the queue never holds more than a chunk of work, so the
    # loop ends within about ``seconds`` of wall-clock time.
    chunk = max(1, min(1000, int(seconds / 100 / per_call)))
    calls = 0
    with Meter(nvml, clock=clock) as meter:
        start = clock()
        while clock() - start < seconds:
            for _ in range(chunk):
                if setup is not None:
                    setup()
                fn()
            calls += chunk
            sync()
    return {
        "watts": meter.watts,
        "joules_per_call": meter.joules / calls,
        "calls": calls,
        "seconds": meter.seconds,
        "source": meter.source,
    }


def per_watt(record: Mapping[str, Any], joules_per_call: float) -> dict[str, float | None]:
    """GFLOP/s per W and GB/s per W of one call of ``record``'s case (FLOPs or bytes per joule)."""
    if joules_per_call <= 0:
        return {"GFLOPs_per_W": None, "GBps_per_W": None}
    flops, nbytes = record.get("flops") or 0, record.get("bytes") or 0
    return {
        "GFLOPs_per_W": flops / 1e9 / joules_per_call if flops else None,
        "GBps_per_W": nbytes / 1e9 / joules_per_call if nbytes else None,
    }


def measure_record(
    record: dict[str, Any],
    timed: Mapping[str, tuple[Callable[[], Any], Callable[[], None] | None]],
    seconds: float,
    nvml: Nvml | None = None,
    sync: Callable[[], None] | None = None,
) -> None:
    """Add watts, joules_per_call, GFLOPs_per_W, GBps_per_W and energy_source to each timed
    candidate of ``record`` (``timed``: its call and setup by name); where NVML is missing, the
    record's ``energy`` says why."""
    try:
        nvml = nvml or nvml_for_current_device()
    except NvmlError as exc:
        record["energy"] = f"not measured: {exc}"
        return
    for name, (fn, setup) in timed.items():
        entry = record["candidates"].get(name)
        if entry is None:
            continue
        got = measure(fn, seconds, nvml=nvml, sync=sync, setup=setup)
        entry["watts"] = got["watts"]
        entry["joules_per_call"] = got["joules_per_call"]
        entry["energy_source"] = got["source"]
        entry.update(per_watt(record, got["joules_per_call"]))
