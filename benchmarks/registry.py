"""The benchmark models, in one list, and the named sets the commands take (`--set zoo`).

A model is a model file (`build_model()` and `example_inputs()`, or named factories for a file
that holds several: benchmarks/models/published.py, seeds.py) with the modes it is measured in
and the packages it imports. On a GPU a seed is measured at its own size (`_full` factories);
on a CPU at one a 2-core machine times in seconds.

Sets:
- `seeds`: the seeds' layers (benchmarks/models/seeds.py);
- `zoo`: the models a CPU run measures (ResNet-18, MobileNetV3-Small, a MONAI 3-D UNet, a
  ReLU/BN block, the two bundled examples), in train and infer mode;
- `published`: published models built from their libraries' own code with small configs and no
  weights (transformers, MONAI, timm, torchvision), in train mode;
- `large`: full-size ImageNet and video networks and a UNet decoder (a GPU's sizes);
- `gpu`: the GPU command's plan (benchmarks/gpu.py): the bundled example, torchvision's
  ResNet-50 and R(2+1)D-18, in train mode.
"""

from __future__ import annotations

import fnmatch
import importlib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS_DIR = "benchmarks/models"


class UsageError(Exception):
    """Bad input on the command line: one line on stderr, exit code 2 (benchmarks/__main__.py)."""


@dataclass(frozen=True)
class Model:
    name: str
    file: str  # relative to the repository root, or an absolute path
    what: str
    modes: tuple[str, ...] = ("train", "infer")
    build: str | None = None  # factories in a file that holds several models
    inputs: str | None = None
    full: bool = False  # has `_full` factories: the seed's own size, used on a GPU
    needs: tuple[str, ...] = ()  # packages the model imports

    @property
    def path(self) -> Path:
        p = Path(self.file)
        return p if p.is_absolute() else ROOT / p

    def target(self, device: str) -> list[str]:
        """What `advisor advise` is given: the file, and its factories where it names them."""
        args = [self.file]
        suffix = "_full" if self.full and device.startswith("cuda") else ""
        if self.build:
            args += ["--build", self.build + suffix]
        if self.inputs:
            args += ["--inputs", self.inputs + suffix]
        return args

    def missing(self) -> str | None:
        """Why the model cannot be built here (a package it needs does not import), or None.
        Any exception counts: a torchvision built for another torch raises RuntimeError."""
        for package in self.needs:
            try:
                importlib.import_module(package)
            except Exception as e:  # noqa: BLE001 - whatever the import raised is the reason
                lines = str(e).strip().splitlines()
                return f"needs {package}: {type(e).__name__}: {lines[0] if lines else ''}"
        return None


def _file(name: str, what: str, **kw: object) -> Model:
    return Model(name, f"{MODELS_DIR}/{name}.py", what, **kw)  # type: ignore[arg-type]


def _seed(name: str, what: str, mode: str) -> Model:
    return Model(f"seed_{name}", f"{MODELS_DIR}/seeds.py", what, modes=(mode,),
                 build=f"build_{name}", inputs=f"inputs_{name}", full=True)  # fmt: skip


def _published(name: str, library: str, what: str) -> Model:
    needs = {"torchvision": ("torchvision",), "timm": ("timm",), "monai": ("monai",),
             "transformers": ("transformers",)}[library]  # fmt: skip
    return Model(name, f"{MODELS_DIR}/published.py", f"{library}: {what}", modes=("train",),
                 build=f"build_{name}", inputs=f"inputs_{name}", needs=needs)  # fmt: skip


EXAMPLES = "advisor/examples"

MODELS: tuple[Model, ...] = (
    # the zoo
    _file("resnet18", "ResNet-18 (torchvision's layout in plain torch), 4 x 3 x 64²"),
    _file("mobilenet_v3_small", "MobileNetV3-Small (torchvision's layout in plain torch), 4 x 3 x 64²"),
    _file("monai_unet3d", "MONAI's 3-D UNet on 1 x 1 x 32³", needs=("monai",)),
    _file("relu_bn_block", "a small ReLU/BatchNorm CNN on 8 x 3 x 32²"),
    Model("small_cnn", f"{EXAMPLES}/small_cnn.py", "the bundled example: a small CNN"),
    Model("video_cnn", f"{EXAMPLES}/video_cnn.py",
          "the bundled video example: factorised Conv3d layers"),  # fmt: skip
    # the seeds' layers
    _seed("conv3d_1x3x3", "Conv3d (1,3,3) on 2 x 2 x 50 x 64² (GPU: 8 x 2 x 500 x 64²)", "train"),
    _seed("dwconvT_bn", "depthwise ConvTranspose2d 2x2/2 + BatchNorm, 256 ch on 16 x 16² "
          "(GPU: 2048 ch, batch 8)", "infer"),  # fmt: skip
    _seed("conv2d_3to16", "Conv2d 3->16 on 1 x 3 x 512² (GPU: 1024²)", "infer"),
    _seed("conv2d_512to1024", "Conv2d 64->128 on 2 x 64 x 64 x 128 (GPU: 512->1024 on "
          "5 x 512 x 128 x 256)", "infer"),  # fmt: skip
    # full-size networks
    _file("tv_resnet50", "torchvision's ResNet-50 on 32 x 3 x 224²", modes=("train",),
          needs=("torchvision",)),  # fmt: skip
    _file("tv_r2plus1d_18", "torchvision's R(2+1)D-18 on 8 x 3 x 16 x 112²", modes=("train",),
          needs=("torchvision",)),  # fmt: skip
    _file("tv_mobilenet_v3_large", "torchvision's MobileNetV3-Large on 64 x 3 x 224²",
          modes=("train",), needs=("torchvision",)),  # fmt: skip
    _file("timm_convnext_tiny", "timm's ConvNeXt-Tiny on 32 x 3 x 224²", modes=("train",),
          needs=("timm",)),  # fmt: skip
    _file("unet_decoder", "a UNet decoder, 1024->64 channels, to 8 x 21 x 256²",
          modes=("train",)),  # fmt: skip
    _file("resnet50_replica", "ResNet-50's layout in plain torch on 32 x 3 x 64²",
          modes=("train",)),  # fmt: skip
    # published models, small configs, no weights
    _published("wav2vec2", "transformers", "audio: 1-D conv front, weight-normed positional "
               "conv (ParametrizedConv1d); ModelOutput"),  # fmt: skip
    _published("hubert", "transformers", "audio: conv front with group norm, weight-normed "
               "positional conv; ModelOutput"),  # fmt: skip
    _published("encodec", "transformers", "audio codec: weight-normed Conv1d/ConvTranspose1d "
               "throughout, LSTM, vector quantiser; ModelOutput"),  # fmt: skip
    _published("hifigan", "transformers", "SpeechT5's HiFi-GAN vocoder, weight-normed: Conv1d, "
               "ConvTranspose1d, dilated residual blocks"),  # fmt: skip
    _published("convnext", "transformers", "ConvNeXt: depthwise 7x7 convs, layer norm"),
    _published("resnet", "transformers", "ResNet: 3x3/1x1 convs, batch norm"),
    _published("mobilenet_v2", "transformers", "MobileNetV2: depthwise and 1x1 convs, ReLU6"),
    _published("efficientnet", "transformers", "EfficientNet: depthwise convs, squeeze-excite"),
    _published("segformer", "transformers", "SegFormer: overlapping patch convs, attention, "
               "3x3 depthwise Mix-FFN"),  # fmt: skip
    _published("segresnet", "monai", "3-D SegResNet: Conv3d, group norm, trilinear upsampling"),
    _published("basic_unet", "monai", "2-D BasicUNet: Conv2d, instance norm, ConvTranspose2d"),
    _published("dynunet", "monai", "2-D DynUNet (nnU-Net): strided and transposed convs"),
    _published("attention_unet", "monai", "2-D AttentionUnet: attention gates, transposed "
               "convs"),  # fmt: skip
    _published("var_autoencoder", "monai", "2-D VarAutoEncoder: strided and transposed convs; "
               "a tuple output"),  # fmt: skip
    _published("timm_nf_resnet", "timm", "NF-ResNet: ScaledStdConv2d throughout"),
    _published("tv_googlenet", "torchvision", "GoogLeNet: a namedtuple output in train mode"),
)
BY_NAME = {m.name: m for m in MODELS}

SETS: dict[str, tuple[str, ...]] = {
    "seeds": tuple(m.name for m in MODELS if m.name.startswith("seed_")),
    "zoo": ("resnet18", "mobilenet_v3_small", "monai_unet3d", "relu_bn_block", "small_cnn",
            "video_cnn"),  # fmt: skip
    "published": tuple(m.name for m in MODELS if m.file.endswith("/published.py")),
    "large": ("tv_resnet50", "tv_r2plus1d_18", "tv_mobilenet_v3_large", "timm_convnext_tiny",
              "unet_decoder"),  # fmt: skip
    "gpu": ("small_cnn", "tv_resnet50", "tv_r2plus1d_18"),
}


def select(names: list[str] | None, sets: list[str] | None) -> list[Model]:
    """The models named (registry names, globs such as 'tv_*', or paths to model files) and
    those of the named sets, in that order, each once. UsageError for a name that matches
    nothing or a set that does not exist."""
    chosen: list[Model] = []
    for s in sets or []:
        if s not in SETS:
            raise UsageError(f"unknown set {s!r}; sets: {', '.join(SETS)}")
        chosen += [BY_NAME[n] for n in SETS[s]]
    for name in names or []:
        hits = [m for m in MODELS if fnmatch.fnmatchcase(m.name, name)]
        if not hits:
            path = Path(name)
            if path.suffix != ".py":
                known = ", ".join(m.name for m in MODELS)
                raise UsageError(f"unknown model {name!r} (not in the registry, not a .py "
                                 f"file); models: {known}")  # fmt: skip
            if not path.is_file():
                raise UsageError(f"model file not found: {name}")
            hits = [Model(path.stem, str(path.resolve()), f"the model file {name}")]
        chosen += hits
    if not chosen:
        raise UsageError("no models: name some, or a set (--set zoo)")
    return list(dict.fromkeys(chosen))
