"""Measure what the CPU input pipeline costs per ImageNet sample on this machine.

The ``imagenet-cpu`` input pipeline of the simulator (``ssaexec.sim.input_pipeline``)
charges ``host_s`` core-seconds per sample. This measures it as torchvision's ImageNet
training loader does it, with Pillow alone (torchvision is not a dependency): decode
a 500x375 JPEG (ImageNet's typical size, quality 90, about 110 KB), crop a random
area of 8-100 % at a random aspect ratio of 3/4-4/3, resize it to 224x224 (bilinear),
flip it, and convert it to a uint8 tensor. One process, one thread, the median of
``--rounds`` rounds of ``--images`` images.

    python bench/input_pipeline.py --out out/input_pipeline.json
"""

import argparse
import io
import json
import math
import random
import statistics
import sys
import time

from ssaexec.sim.calibrate import cpu_name


def _jpeg(seed):
    """A 500x375 JPEG of natural-looking content (smooth shapes plus fine noise)."""
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:375, 0:500].astype(np.float32)
    img = np.zeros((375, 500, 3), np.float32)
    for c in range(3):
        for _ in range(6):
            fx, fy, ph = rng.uniform(0.005, 0.05, 2).tolist() + [rng.uniform(0, 6.3)]
            img[..., c] += 40 * np.sin(fx * x + fy * y + ph)
    img += rng.normal(0, 18, img.shape)
    img = np.clip(img + 128, 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _sample(data, rng):
    import numpy as np
    import torch
    from PIL import Image
    im = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = im.size
    for _ in range(10):
        area = w * h * rng.uniform(0.08, 1.0)
        ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw, ch = int(round(math.sqrt(area * ratio))), int(round(math.sqrt(area / ratio)))
        if 0 < cw <= w and 0 < ch <= h:
            break
    else:
        cw, ch = min(w, h), min(w, h)
    left, top = rng.randint(0, w - cw), rng.randint(0, h - ch)
    im = im.resize((224, 224), Image.BILINEAR, box=(left, top, left + cw, top + ch))
    if rng.random() < 0.5:
        im = im.transpose(Image.FLIP_LEFT_RIGHT)
    return torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    try:
        import PIL  # noqa: F401
    except ImportError:
        print("input_pipeline: Pillow is not installed; nothing measured")
        return 0
    import torch
    torch.set_num_threads(1)
    files = [_jpeg(i) for i in range(16)]
    rng = random.Random(0)
    rounds = []
    for r in range(args.rounds):
        t0 = time.perf_counter()
        for i in range(args.images):
            _sample(files[i % len(files)], rng)
        rounds.append((time.perf_counter() - t0) / args.images)
        print(f"round {r + 1}: {rounds[-1] * 1e3:.2f} ms per image", flush=True)
    host_s = statistics.median(rounds)
    doc = {"host_s_per_sample": host_s, "rounds_s": rounds, "images": args.images,
           "jpeg_bytes_mean": statistics.mean(len(f) for f in files),
           "machine": cpu_name(),
           "python": sys.version.split()[0], "torch": torch.__version__}
    print(f"median {host_s * 1e3:.2f} ms per image ({1 / host_s:.0f} images/s per core), "
          f"JPEGs of {doc['jpeg_bytes_mean'] / 1e3:.0f} KB")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
