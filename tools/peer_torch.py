"""The same networks' training steps in PyTorch: the report's same-machine peer.

  python -m tools.peer_torch --model vgg --depth 16 --batch 256 --dtype bfloat16

Prints one JSON line: examples/s of a plain PyTorch training step (forward, cross-entropy,
backward, SGD with Nesterov momentum) on one device, channels-last, with bfloat16 autocast for
`--dtype bfloat16`, on a fixed batch already on the device. Our step does more: it gathers and
augments its batch on the device. PyTorch is not a dependency of this project: the report runs
this only where `torch` imports (`torchvision` too, for Inception-v3).
"""

import argparse
import json
import statistics
import time

import torch
from torch import nn

VGG_STAGES = {  # as research/models/vgg.py
  11: [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
  16: [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
}


def vgg(depth: int, width: float, num_classes: int) -> nn.Module:
  """VGG-BN for 32×32 images: 3×3 convolutions without bias, BatchNorm, ReLU; one linear head."""
  layers, channels = [], 3
  for layer in VGG_STAGES[depth]:
    if layer == "M":
      layers.append(nn.MaxPool2d(2))
      continue
    features = max(1, round(layer * width))
    layers += [nn.Conv2d(channels, features, 3, padding=1, bias=False), nn.BatchNorm2d(features)]
    layers.append(nn.ReLU(inplace=True))
    channels = features
  return nn.Sequential(*layers, nn.Flatten(), nn.Linear(channels, num_classes))


def keras_cnn(num_classes: int) -> nn.Module:
  """The Keras cifar10_cnn.py network, as research/models/keras_cnn.py."""
  return nn.Sequential(
    nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3), nn.ReLU(),
    nn.MaxPool2d(2), nn.Dropout(0.25),
    nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3), nn.ReLU(),
    nn.MaxPool2d(2), nn.Dropout(0.25),
    nn.Flatten(), nn.Linear(6 * 6 * 64, 512), nn.ReLU(), nn.Dropout(0.5),
    nn.Linear(512, num_classes),
  )  # fmt: skip


def build(args) -> nn.Module:
  if args.model == "vgg":
    return vgg(args.depth, args.width, args.num_classes)
  if args.model == "keras_cnn":
    return keras_cnn(args.num_classes)
  import torchvision  # only Inception-v3 needs it

  return torchvision.models.inception_v3(
    weights=None, aux_logits=True, init_weights=True, num_classes=args.num_classes
  )


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", choices=("vgg", "keras_cnn", "inception_v3"), required=True)
  parser.add_argument("--batch", type=int, required=True)
  parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
  parser.add_argument("--steps", type=int, default=50, help="timed steps, after 5 warm-up steps")
  parser.add_argument("--rounds", type=int, default=1, help="timings of --steps; the median counts")
  parser.add_argument("--image-size", type=int, default=32)
  parser.add_argument("--num-classes", type=int, default=10)
  parser.add_argument("--depth", type=int, default=16)
  parser.add_argument("--width", type=float, default=1.0)
  args = parser.parse_args()

  device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
  model = build(args).to(device).to(memory_format=torch.channels_last).train()
  optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True)
  images = torch.randn(args.batch, 3, args.image_size, args.image_size, device=device)
  images = images.to(memory_format=torch.channels_last)
  labels = torch.randint(0, args.num_classes, (args.batch,), device=device)
  autocast = torch.autocast(device.type, torch.bfloat16, enabled=args.dtype == "bfloat16")

  def step():
    optimizer.zero_grad(set_to_none=True)
    with autocast:
      outputs = model(images)
      if isinstance(outputs, tuple):  # Inception-v3: (logits, aux_logits), aux weighted 0.4
        loss = nn.functional.cross_entropy(outputs[0], labels)
        loss = loss + 0.4 * nn.functional.cross_entropy(outputs[1], labels)
      else:
        loss = nn.functional.cross_entropy(outputs, labels)
    loss.backward()
    optimizer.step()

  sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
  for _ in range(5):
    step()
  sync()
  speeds = []
  for _ in range(args.rounds):
    start = time.perf_counter()
    for _ in range(args.steps):
      step()
    sync()
    speeds.append(args.steps * args.batch / (time.perf_counter() - start))
  name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
  print(
    json.dumps(
      {
        "examples_per_sec": statistics.median(speeds),
        **({"examples_per_sec_rounds": speeds} if args.rounds > 1 else {}),
        "device": name,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "model": args.model,
        "batch": args.batch,
        "dtype": args.dtype,
      }
    )
  )


if __name__ == "__main__":
  main()
