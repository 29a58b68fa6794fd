"""``Conv2d`` backed by ``tritonkit.conv2d``, batch-norm folding, and a converter that swaps a
model's convolutions (fusing what follows them in eval mode)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tritonkit.ops.conv import conv2d


class Conv2d(torch.nn.Conv2d):
    """``torch.nn.Conv2d`` computed by ``tritonkit.conv2d``, with an optional fused epilogue.

    ``activation`` (None, "relu", "gelu", "silu") is applied in the convolution's kernel, and
    ``forward(x, residual)`` adds ``residual`` before it: ``act(conv(x) + bias + residual)``.
    Parameters, state dict and constructor are torch.nn.Conv2d's.
    """

    def __init__(self, *args, activation: str | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.activation = activation

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        padding = self.padding
        if self.padding_mode != "zeros":
            # Non-zero padding modes pad the input first, as torch.nn.Conv2d does.
            x = F.pad(x, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            padding = 0
        return conv2d(
            x, self.weight, self.bias, self.stride, padding, self.dilation, self.groups,
            residual=residual, activation=self.activation,
        )  # fmt: skip

    def extra_repr(self) -> str:
        extra = f", activation={self.activation!r}" if self.activation else ""
        return super().extra_repr() + extra

    @classmethod
    def from_conv(cls, conv: torch.nn.Conv2d, activation: str | None = None) -> Conv2d:
        """A tritonkit Conv2d sharing ``conv``'s parameters (no copy)."""
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.__dict__.update({k: v for k, v in conv.__dict__.items() if not k.startswith("_")})
        new._reversed_padding_repeated_twice = conv._reversed_padding_repeated_twice
        new._parameters = dict(conv._parameters)
        new._buffers = dict(conv._buffers)
        new.training = conv.training
        new.activation = activation
        return new


def fuse_conv_bn(
    conv: torch.nn.Conv2d, bn: torch.nn.BatchNorm2d, activation: str | None = None
) -> Conv2d:
    """A tritonkit Conv2d computing ``bn(conv(x))`` as BatchNorm2d computes it in eval mode
    (running statistics): ``w * g`` and ``(b - mean) * g + beta`` with ``g = gamma /
    sqrt(var + eps)`` per output channel, folded in float64 and rounded once to the weight's
    dtype. Then ``activation`` is fused too. The new module's parameters are new tensors."""
    if bn.running_mean is None or bn.running_var is None:
        raise ValueError("fuse_conv_bn: bn must track running statistics (track_running_stats)")
    if bn.num_features != conv.out_channels:
        raise ValueError(
            f"fuse_conv_bn: bn has {bn.num_features} features, conv has {conv.out_channels} "
            "output channels"
        )
    w = conv.weight.detach()
    g = bn.running_var.detach().double().add(bn.eps).rsqrt()
    if bn.weight is not None:
        g = g * bn.weight.detach().double()
    b = -bn.running_mean.detach().double()
    if conv.bias is not None:
        b = b + conv.bias.detach().double()
    b = b * g
    if bn.bias is not None:
        b = b + bn.bias.detach().double()
    fused = Conv2d.from_conv(conv, activation)
    shape = (-1, 1, 1, 1)
    weight = (w.double() * g.view(shape)).to(w.dtype)
    fused.weight = torch.nn.Parameter(
        weight.contiguous(memory_format=_format(w)), requires_grad=conv.weight.requires_grad
    )
    fused.bias = torch.nn.Parameter(b.to(w.dtype), requires_grad=conv.weight.requires_grad)
    return fused


def _format(t: torch.Tensor) -> torch.memory_format:
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


_ACTS = {torch.nn.ReLU: "relu", torch.nn.SiLU: "silu"}


def _activation(m: torch.nn.Module) -> str | None:
    if isinstance(m, torch.nn.GELU):
        return "gelu" if m.approximate == "none" else None
    return _ACTS.get(type(m))


class FusedBlock(torch.nn.Module):
    """A torchvision Bottleneck or BasicBlock in eval mode with every batch norm folded:
    ``relu(conv_last(...) + bias + identity)`` runs in the last convolution's kernel, and each
    earlier conv carries its relu (what ``convert_conv2d`` puts in a block's place)."""

    def __init__(self, convs: list[Conv2d], downsample: torch.nn.Module | None) -> None:
        super().__init__()
        self.convs = torch.nn.ModuleList(convs)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = x
        for conv in self.convs[:-1]:
            out = conv(out)
        return self.convs[-1](out, identity)


def _fused_block(m: torch.nn.Module, depth: int) -> FusedBlock:
    convs = [
        fuse_conv_bn(getattr(m, f"conv{i}"), getattr(m, f"bn{i}"), "relu")
        for i in range(1, depth + 1)
    ]
    down = m.downsample
    if down is not None:
        down = fuse_conv_bn(down[0], down[1])
    return FusedBlock(convs, down)


def _is_block(m: torch.nn.Module, n: int) -> bool:
    """torchvision's residual blocks by their attributes: conv1..n, bn1..n, a ReLU, and a
    downsample (None or Sequential(conv, bn))."""
    need = [f"conv{i}" for i in range(1, n + 1)] + [f"bn{i}" for i in range(1, n + 1)]
    if not all(
        isinstance(getattr(m, a, None), (torch.nn.Conv2d, torch.nn.BatchNorm2d)) for a in need
    ):
        return False
    if hasattr(m, f"conv{n + 1}") or not isinstance(getattr(m, "relu", None), torch.nn.ReLU):
        return False
    down = getattr(m, "downsample", "missing")
    return down is None or (
        isinstance(down, torch.nn.Sequential)
        and len(down) == 2
        and isinstance(down[0], torch.nn.Conv2d)
        and isinstance(down[1], torch.nn.BatchNorm2d)
    )


def _is_stem(m: torch.nn.Module) -> bool:
    """torchvision's ResNet stem: conv1, bn1, relu (used there alone), maxpool, layer1."""
    return (
        isinstance(getattr(m, "conv1", None), torch.nn.Conv2d)
        and isinstance(getattr(m, "bn1", None), torch.nn.BatchNorm2d)
        and isinstance(getattr(m, "relu", None), torch.nn.ReLU)
        and hasattr(m, "maxpool")
        and hasattr(m, "layer1")
        and not hasattr(m, "conv2")
    )


def convert_conv2d(model: torch.nn.Module, fuse: bool | None = None) -> torch.nn.Module:
    """Swap ``model``'s torch.nn.Conv2d modules (in place) for tritonkit's ``Conv2d``,
    sharing their parameters. With ``fuse`` (default: when the model is in eval mode), a
    BatchNorm2d right after a convolution in a Sequential is folded into it, and a
    ReLU/SiLU/GELU after that fused into its epilogue (both replaced by Identity);
    torchvision's Bottleneck and BasicBlock blocks (recognized by their attributes) fold
    their batch norms and run ``relu(conv + bias + identity)`` in the last convolution's
    kernel. Returns the model. Fusing a model in training mode is refused (ValueError):
    folding uses the running statistics, which training does not."""
    fuse = (not model.training) if fuse is None else fuse
    if fuse and model.training:
        raise ValueError("tritonkit.nn.convert_conv2d: fuse=True needs the model in eval mode")
    if fuse:
        _fuse(model)
    _swap(model)
    return model


def _fuse(module: torch.nn.Module) -> None:
    if _is_stem(module):
        module.conv1 = fuse_conv_bn(module.conv1, module.bn1, "relu")
        module.bn1 = torch.nn.Identity()
        module.relu = torch.nn.Identity()
    for name, child in module.named_children():
        depth = next((d for d in (3, 2) if _is_block(child, d)), None)
        if depth is not None:
            setattr(module, name, _fused_block(child, depth))
    if isinstance(module, torch.nn.Sequential):
        items = list(module)
        i = 0
        while i < len(items):
            if (
                type(items[i]) in (torch.nn.Conv2d, Conv2d)
                and i + 1 < len(items)
                and isinstance(items[i + 1], torch.nn.BatchNorm2d)
            ):
                act = _activation(items[i + 2]) if i + 2 < len(items) else None
                module[i] = fuse_conv_bn(items[i], items[i + 1], act)
                module[i + 1] = torch.nn.Identity()
                if act is not None:
                    module[i + 2] = torch.nn.Identity()
                i += 3 if act is not None else 2
                continue
            i += 1
    for child in module.children():
        if not isinstance(child, FusedBlock):
            _fuse(child)


def _swap(module: torch.nn.Module) -> None:
    for name, child in module.named_children():
        if type(child) is torch.nn.Conv2d:
            setattr(module, name, Conv2d.from_conv(child))
        else:
            _swap(child)
