#!/usr/bin/env python3
"""Imports a user's model as a HAPI model package (`hapi-model import` runs this).

SOURCE is one of:
  - a TorchScript file (`.pt`, `.pth`, `.ts`): layered by its top-level children, in order,
    descending into `Sequential` containers, when calling them in that order reproduces the
    model (a `flatten(1)` is inserted where a child needs 2-D input); otherwise one layer;
  - an ONNX file (`.onnx`): converted with onnx2torch, then layered as a torch.fx graph;
  - `module:function` (a Python module on PYTHONPATH or in the current directory, and a
    function of it returning an `nn.Module`): layered as a torch.fx graph.

Automatic layering (torch.fx): the graph is cut wherever exactly one tensor is live, so a
residual, dense or transformer block (inside which two or more are live) stays one layer, as
in the HAPI paper; a piece that belongs to the previous layer's module (a block's closing
activation after its residual add) joins it. Constants and parameters (get_attr nodes and what is computed from them
alone) are copied into each layer that uses them and never keep a cut from happening.
`--cut-at` keeps only the named cut points; `--max-layers` merges neighbouring layers (the
pair with the fewest parameters first) down to that many.

Each layer is traced to TorchScript (batch 2, checked on batch 3), the chain of layers is
checked against the whole model, and the package (manifest.json, layer files,
reference.safetensors) is written to OUT/NAME. Preprocessing is declared in the manifest,
never baked into a layer.
"""

import argparse
import importlib
import json
import os
import re
import shutil
import sys
import time
import warnings

import torch
import torch.fx as fx
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_models import BATCH_TRACE, FORMAT, Flatten, write_safetensors  # noqa: E402

warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]


def fail(msg):
    sys.exit(f"hapi-model import: {msg}")


# -- loading --------------------------------------------------------------------------------


def load(source):
    """(module, kind) for SOURCE."""
    lower = source.lower()
    if lower.endswith(".onnx"):
        if not os.path.isfile(source):
            fail(f"{source}: no such file")
        try:
            import onnx
            import onnx2torch
        except ImportError:
            fail("ONNX import needs onnx and onnx2torch (installed by `cargo xtask setup`)")
        model = onnx.load(source)
        initializers_behind_identities(model)
        try:
            return onnx2torch.convert(model), "onnx"
        except (KeyError, NotImplementedError, ValueError) as e:
            fail(f"{source}: onnx2torch cannot convert it: {type(e).__name__}: {e}")
    if lower.endswith((".pt", ".pth", ".ts")):
        if not os.path.isfile(source):
            fail(f"{source}: no such file")
        try:
            return torch.jit.load(source, map_location="cpu"), "torchscript"
        except RuntimeError as e:
            fail(f"{source}: not a TorchScript file ({str(e).splitlines()[0]}); save the model "
                 "with torch.jit.save, or pass module:function")
    if ":" in source:
        mod_name, fn_name = source.split(":", 1)
        sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(mod_name)
        except ImportError as e:
            fail(f"{source}: cannot import `{mod_name}`: {e}")
        fn = getattr(module, fn_name, None)
        if fn is None:
            fail(f"{source}: `{mod_name}` has no `{fn_name}`")
        model = fn()
        if not isinstance(model, nn.Module):
            fail(f"{source}: returned {type(model).__name__}, not an nn.Module")
        return model, "python"
    fail(f"{source}: expected a .pt/.pth TorchScript file, an .onnx file or module:function")


def initializers_behind_identities(model):
    """PyTorch's ONNX exporter shares equal weights through `Identity` nodes reading one
    initializer; onnx2torch looks weights up among the initializers by name. Each such
    Identity becomes a copy of the initializer under its output's name."""
    from onnx import numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    keep = []
    for node in model.graph.node:
        if node.op_type == "Identity" and node.input[0] in inits:
            copy = numpy_helper.from_array(numpy_helper.to_array(inits[node.input[0]]), node.output[0])
            model.graph.initializer.append(copy)
            inits[copy.name] = copy
        else:
            keep.append(node)
    del model.graph.node[:]
    model.graph.node.extend(keep)


# -- layering a torch.fx graph ---------------------------------------------------------------


def constant_nodes(graph):
    """Nodes that do not depend on the input: parameters, buffers and what is computed from
    them alone. They can be recomputed in every layer that needs them."""
    const = set()
    for n in graph.nodes:
        if n.op == "get_attr":
            const.add(n)
        elif n.op in ("call_function", "call_method", "call_module"):
            inputs = n.all_input_nodes
            if n.op != "call_module" and inputs and all(i in const for i in inputs):
                const.add(n)
    return const


def cut_points(graph, const):
    """Nodes after which exactly that node's tensor is live."""
    nodes = [n for n in graph.nodes if n.op != "output"]
    index = {n: i for i, n in enumerate(graph.nodes)}
    last_use = {}
    for n in graph.nodes:
        for i in n.all_input_nodes:
            last_use[i] = max(last_use.get(i, -1), index[n])
    cuts = []
    live = set()
    for n in nodes:
        if n.op == "placeholder" or n in const:
            if n.op == "placeholder":
                live.add(n)
            continue
        live.add(n)
        live = {v for v in live if last_use.get(v, -1) > index[n]}
        if live == {n}:
            cuts.append(n)
    return cuts


def layer_name(nodes):
    # Module paths as dotted names (onnx2torch's use `/` as well).
    targets = [re.sub(r"[./]+", ".", str(n.target)) for n in nodes if n.op == "call_module"]
    if targets:
        parts = [t.split(".") for t in targets]
        common = []
        for segs in zip(*parts):
            if all(s == segs[0] for s in segs):
                common.append(segs[0])
            else:
                break
        if common:
            return ".".join(common)
        return targets[0]
    return nodes[-1].name


def fx_layers(gm, cut_at, const):
    """[(name, GraphModule)] cut at `cut_at` nodes."""
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        fail(f"the model takes {len(placeholders)} inputs; a package's model takes one image tensor")
    output = next(n for n in graph.nodes if n.op == "output")
    if not isinstance(output.args[0], fx.Node):
        fail("the model returns more than one tensor; a package's model returns one")
    body = [n for n in graph.nodes if n.op not in ("placeholder", "output") and n not in const]
    cut_set = set(cut_at)
    segments, current = [], []
    for n in body:
        current.append(n)
        if n in cut_set or n is output.args[0]:
            segments.append(current)
            current = []
    if current:
        segments[-1].extend(current)
    # A piece of the previous layer's module (a block's closing `layer1.0.relu` after the
    # residual add, a transformer block's MLP half after its attention half) belongs to that
    # layer: the paper counts a block as one layer.
    merged = []
    for seg in segments:
        prev = layer_name(merged[-1]) if merged else None
        name = layer_name(seg)
        if prev is not None and (name == prev or name.startswith(prev + ".")):
            merged[-1] = merged[-1] + seg
        else:
            merged.append(seg)
    segments = merged
    layers = []
    incoming = placeholders[0]
    for seg in segments:
        g = fx.Graph()
        env = {}
        x = g.placeholder("x")
        env[incoming] = x

        def copy(node):
            if node in env:
                return env[node]
            if node not in const:
                fail(f"node `{node.name}` is used across a cut; use other --cut-at points")
            for i in node.all_input_nodes:
                copy(i)
            env[node] = g.node_copy(node, lambda a: env[a])
            return env[node]

        for n in seg:
            for i in n.all_input_nodes:
                copy(i)
            env[n] = g.node_copy(n, lambda a: env[a])
        g.output(env[seg[-1]])
        layers.append((layer_name(seg), fx.GraphModule(gm, g)))
        incoming = seg[-1]
    return layers


def sequential_children(model, x):
    """TorchScript (or any module): children in order, descending into Sequential, with a
    flatten inserted where a child needs 2-D input. None if that does not reproduce the model."""

    def expand(m, prefix):
        out = []
        for name, child in m.named_children():
            full = f"{prefix}{name}"
            kind = getattr(child, "original_name", type(child).__name__)
            if kind == "Sequential":
                out += expand(child, full + ".")
            else:
                out.append((full, child))
        return out

    children = expand(model, "")
    if not children:
        return None
    layers, h = [], x
    with torch.no_grad():
        want = model(x)
        for name, child in children:
            try:
                y = child(h)
            except RuntimeError:
                if h.dim() <= 2:
                    return None
                layers.append(("flatten", Flatten()))
                h = torch.flatten(h, 1)
                try:
                    y = child(h)
                except RuntimeError:
                    return None
            layers.append((name, child))
            h = y
        if not isinstance(h, torch.Tensor) or h.shape != want.shape:
            return None
        if (h - want).abs().max().item() > 1e-4:
            return None
    return layers


def merge(layers, max_layers, params):
    """Merges neighbouring layers, the pair with the fewest parameters first."""
    groups = [[l] for l in layers]
    while len(groups) > max_layers:
        sizes = [sum(params(m) for _, m in a) + sum(params(m) for _, m in b)
                 for a, b in zip(groups, groups[1:])]
        i = sizes.index(min(sizes))
        groups[i : i + 2] = [groups[i] + groups[i + 1]]
    out = []
    for g in groups:
        if len(g) == 1:
            out.append(g[0])
        else:
            out.append((g[0][0] + ".." + g[-1][0], nn.Sequential(*[m for _, m in g])))
    return out


def params(m):
    try:
        return sum(p.numel() for p in m.parameters())
    except (RuntimeError, AttributeError):
        return 0


def validate(manifest):
    """Checks the manifest against model/manifest.schema.json (beside this script when
    `hapi-model import` runs it, one directory up in a checkout)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for path in (os.path.join(here, "manifest.schema.json"), os.path.join(here, "..", "manifest.schema.json")):
        if os.path.isfile(path):
            break
    else:
        fail("manifest.schema.json not found beside the importer")
    import jsonschema

    with open(path) as f:
        schema = json.load(f)
    try:
        jsonschema.validate(manifest, schema)
    except jsonschema.ValidationError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "(top)"
        fail(f"the manifest does not follow the schema at {where}: {e.message}")


# -- main ------------------------------------------------------------------------------------


def floats(text, what):
    try:
        v = [float(x) for x in text.split(",")]
    except ValueError:
        fail(f"--{what} {text}: expected three numbers, e.g. 0.485,0.456,0.406")
    if len(v) != 3:
        fail(f"--{what} {text}: expected three numbers, got {len(v)}")
    return v


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source")
    ap.add_argument("--name", required=True, help="package name: lowercase letters, digits, _")
    ap.add_argument("--out", required=True, help="models directory; the package is OUT/NAME")
    ap.add_argument("--display-name")
    ap.add_argument("--license", default="unknown (imported by the user)")
    ap.add_argument("--weights", default="imported by the user")
    ap.add_argument("--labels", help="a file with one class label per line")
    ap.add_argument("--channel-order", choices=["rgb", "bgr"], default="rgb")
    ap.add_argument("--layout", choices=["nchw", "nhwc"], default="nchw")
    ap.add_argument("--scale", type=float, choices=[1.0, 255.0], default=1.0)
    ap.add_argument("--mean", default=",".join(map(str, IMAGENET_MEAN)))
    ap.add_argument("--std", default=",".join(map(str, IMAGENET_STD)))
    ap.add_argument("--resize", choices=["shorter", "squash"], default="shorter")
    ap.add_argument("--size", type=int, default=256, help="resize target (pixels)")
    ap.add_argument("--crop", type=int, default=224)
    ap.add_argument("--interpolation", choices=["bilinear", "bicubic"], default="bilinear")
    ap.add_argument("--cut-at", default="", help="comma-separated fx node names to cut after")
    ap.add_argument("--max-layers", type=int)
    ap.add_argument("--freeze-index", type=int, help="default: all layers but the last")
    ap.add_argument("--force", action="store_true", help="replace an existing package")
    args = ap.parse_args()

    name = args.name
    if not name or not all(c.islower() or c.isdigit() or c == "_" for c in name):
        fail(f"--name `{name}`: lowercase letters, digits and `_` only")
    if args.crop <= 0 or args.size < args.crop:
        fail(f"--size {args.size} must be at least --crop {args.crop} > 0")
    final = os.path.join(args.out, name)
    if os.path.exists(final) and not args.force:
        fail(f"{final} exists; choose another --name or pass --force")
    mean, std = floats(args.mean, "mean"), floats(args.std, "std")
    if any(s <= 0 for s in std):
        fail(f"--std {args.std}: must be positive")

    started = time.time()
    torch.set_num_threads(os.cpu_count() or 1)
    model, kind = load(args.source)
    model.eval()
    shape = [3, args.crop, args.crop] if args.layout == "nchw" else [args.crop, args.crop, 3]
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn([BATCH_TRACE] + shape, generator=gen)
    x3 = torch.randn([3] + shape, generator=gen)
    with torch.no_grad():
        try:
            full, full3 = model(x), model(x3)
        except Exception as e:  # noqa: BLE001 - any failure here is the user's model/input mismatch
            fail(f"the model does not run on a {[BATCH_TRACE] + shape} input ({args.layout}): "
                 f"{str(e).splitlines()[0]}")
    if not isinstance(full, torch.Tensor):
        fail(f"the model returns {type(full).__name__}; a package's model returns one tensor")

    if kind == "torchscript":
        if args.cut_at:
            fail("--cut-at names torch.fx nodes; a TorchScript file is layered by its children")
        layers = sequential_children(model, x)
        how = "top-level children"
        if layers is None:
            print("  TorchScript: calling its children in order does not reproduce the model; "
                  "importing it as one layer (export it with torch.fx-traceable code, or pass "
                  "module:function, for finer layers)", flush=True)
            layers, how = [("model", model)], "one layer"
    else:
        gm = model if isinstance(model, fx.GraphModule) else fx.symbolic_trace(model)
        const = constant_nodes(gm.graph)
        cuts = cut_points(gm.graph, const)
        if args.cut_at:
            by_name = {n.name: n for n in cuts}
            wanted = [c for c in args.cut_at.split(",") if c]
            bad = [c for c in wanted if c not in by_name]
            if bad:
                fail(f"--cut-at {bad}: not cut points (where one tensor is live); "
                     f"valid: {', '.join(n.name for n in cuts)}")
            cuts = [by_name[c] for c in wanted]
        layers = fx_layers(gm, cuts, const)
        how = f"torch.fx, {len(list(gm.graph.nodes))} nodes"
    if args.max_layers:
        layers = merge(layers, args.max_layers, params)
    n = len(layers)
    freeze = n - 1 if args.freeze_index is None else args.freeze_index
    if not 0 <= freeze <= n:
        fail(f"--freeze-index {freeze}: must be 0..={n}")

    tmp = final + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    entries = []
    used = set()
    with torch.no_grad():
        h, h3 = x, x3
        for i, (lname, mod) in enumerate(layers):
            if isinstance(mod, torch.jit.ScriptModule):
                traced = mod  # a TorchScript child is saved as it is
            else:
                traced = torch.jit.trace(mod, (h,), check_trace=False)
            stem = "".join(c if c.isalnum() else "_" for c in lname)[:40] or "layer"
            file = f"{i:02d}_{stem}.pt"
            while file in used:
                file = f"{i:02d}_{stem}_{len(used)}.pt"
            used.add(file)
            torch.jit.save(traced, os.path.join(tmp, file))
            out, out3 = traced(h), traced(h3)
            eager3 = mod(h3)
            if out3.shape != eager3.shape or (out3 - eager3).abs().max() > 1e-4:
                fail(f"layer {i} ({lname}) does not generalise over the batch size")
            entries.append(dict(name=lname, file=file, input_shape=list(h.shape[1:]),
                                output_shape=list(out.shape[1:]), params=params(mod)))
            h, h3 = out, out3
        diff = max((h - full).abs().max().item(), (h3 - full3).abs().max().item())
        scale = max(full.abs().max().item(), 1.0)
        if diff > 1e-4 * scale:
            fail(f"the chained layers differ from the whole model by {diff:.2e}")
    write_safetensors(os.path.join(tmp, "reference.safetensors"), {"input": x, "output": full})
    labels = None
    if args.labels:
        labels = "labels.txt"
        shutil.copyfile(args.labels, os.path.join(tmp, labels))
    manifest = dict(
        format=FORMAT,
        name=name,
        display_name=args.display_name or name,
        source=f"imported from {os.path.basename(args.source)} ({kind})",
        license=args.license,
        weights=args.weights,
        torch_version=torch.__version__.split("+")[0],
        input=dict(
            shape=shape,
            resize=args.size,
            crop=args.crop,
            mean=mean,
            std=std,
            resize_mode=args.resize,
            interpolation=args.interpolation,
            channel_order=args.channel_order,
            layout=args.layout,
            scale=args.scale,
        ),
        labels=labels,
        freeze_index=freeze,
        layers=entries,
    )
    validate(manifest)
    with open(os.path.join(tmp, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    width = max(len(e["name"]) for e in entries)
    print(f"{name}: {n} layers ({how}), freeze index {freeze}, chain vs whole model {diff:.1e}, "
          f"{time.time() - started:.1f} s")
    for i, e in enumerate(entries):
        mark = "frozen" if i < freeze else "trained"
        print(f"  {i:3d}  {e['name']:<{width}}  {str(e['output_shape']):<18} "
              f"{e['params']:>10} params  {mark}")


if __name__ == "__main__":
    main()
