"""What Pillow and torchvision compute, for the Rust preprocessing's parity tests.

Usage: pillow_reference.py JOBS.json OUT_DIR

JOBS.json is a list of jobs; job i writes OUT_DIR/i.bin:
  {"op": "decode", "file": F}
      the image as PIL opens it, converted to RGB: height x width x 3 bytes
  {"op": "resize", "file": F, "size": [W, H], "filter": "bilinear" | "bicubic"}
      PIL's Image.resize of the image in its own mode (L or RGB): H x W x bands bytes
  {"op": "torchvision", "file": F, "resize": R, "crop": C, "mean": [...], "std": [...],
   "resize_mode": "shorter" | "squash", "interpolation": "bilinear" | "bicubic",
   "channel_order": "rgb" | "bgr", "layout": "nchw" | "nhwc", "scale": 1 | 255}
      Resize(R) (or Resize((R, R)) to squash) with that interpolation, CenterCrop(C),
      ToTensor() (or PILToTensor().float() for scale 255), channels reversed for bgr,
      Normalize(mean, std), permuted to H x W x 3 for nhwc: float32, little-endian
  {"op": "jpeg", "file": F, "mode": "L" | "RGB" | "CMYK", "save": {...}}
      the image converted to that mode and written by Pillow as a JPEG, with `save`'s
      keyword arguments (quality, progressive, subsampling, restart_marker_blocks, ...):
      the file's bytes
"""

import io

import json
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torchvision import transforms

FILTERS = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}


def main() -> None:
    jobs = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    torch.set_num_threads(1)
    for i, job in enumerate(jobs):
        img = Image.open(job["file"])
        if job["op"] == "decode":
            data = np.asarray(img.convert("RGB"), dtype=np.uint8).tobytes()
        elif job["op"] == "resize":
            if img.mode not in ("L", "RGB"):
                raise SystemExit(f"{job['file']}: mode {img.mode}, expected L or RGB")
            data = np.asarray(img.resize(tuple(job["size"]), FILTERS[job["filter"]])).tobytes()
        elif job["op"] == "torchvision":
            r = job["resize"]
            size = (r, r) if job.get("resize_mode", "shorter") == "squash" else r
            interp = transforms.InterpolationMode[job.get("interpolation", "bilinear").upper()]
            geometry = transforms.Compose(
                [transforms.Resize(size, interpolation=interp), transforms.CenterCrop(job["crop"])]
            )
            cropped = geometry(img.convert("RGB"))
            if job.get("scale", 1) == 255:
                x = transforms.PILToTensor()(cropped).float()
            else:
                x = transforms.ToTensor()(cropped)
            if job.get("channel_order", "rgb") == "bgr":
                x = x[[2, 1, 0]]
            x = transforms.Normalize(job["mean"], job["std"])(x)
            if job.get("layout", "nchw") == "nhwc":
                x = x.permute(1, 2, 0).contiguous()
            data = x.numpy().astype("<f4").tobytes()
        elif job["op"] == "jpeg":
            buf = io.BytesIO()
            img.convert(job["mode"]).save(buf, "JPEG", **job["save"])
            data = buf.getvalue()
        else:
            raise SystemExit(f"unknown op {job['op']!r}")
        (out / f"{i}.bin").write_bytes(data)


if __name__ == "__main__":
    main()
