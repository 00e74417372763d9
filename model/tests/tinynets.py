"""Small models for the import tests (`hapi-model import`): fast to trace, with the structures
the layering must handle (a residual block, a parameter shared by position, NHWC input)."""

import torch
import torch.nn as nn


class Block(nn.Module):
    """A residual block: two tensors are live inside it, so it must stay one layer."""

    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.bn = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(x + self.conv2(self.relu(self.bn(self.conv1(x)))))


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 4, stride=4)
        self.act = nn.ReLU()
        self.block1 = Block(8)
        self.block2 = Block(8)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = self.block2(self.block1(self.act(self.stem(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


class TinyNhwc(nn.Module):
    """A TensorFlow-style model: it takes NHWC input and transposes it itself."""

    def __init__(self):
        super().__init__()
        self.net = Tiny()

    def forward(self, x):
        return self.net(x.permute(0, 3, 1, 2))


def tiny():
    torch.manual_seed(0)
    m = Tiny().eval()
    # Non-trivial batch-norm statistics, so that a wrong layer order would show.
    for b in (m.block1.bn, m.block2.bn):
        b.running_mean.uniform_(-0.5, 0.5)
        b.running_var.uniform_(0.5, 2.0)
    return m


def tiny_nhwc():
    m = TinyNhwc().eval()
    m.net = tiny()
    return m


def save_torchscript(path):
    torch.jit.save(torch.jit.script(tiny()), path)


def save_onnx_nhwc(path, crop):
    torch.onnx.export(
        tiny_nhwc(),
        (torch.randn(1, crop, crop, 3),),
        path,
        dynamo=False,
        input_names=["input"],
        output_names=["logits"],
        dynamic_axes={"input": {0: "n"}, "logits": {0: "n"}},
        opset_version=17,
    )
