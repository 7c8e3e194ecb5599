"""DINOv2 in multihead's VisionTransformer (kept importable from here): the family, its preprocessing and loading
live in :mod:`multihead.pretrained.families.dinov2`."""

from .pretrained.families.dinov2 import *  # noqa: F401,F403
from .pretrained.families.dinov2 import FILE, MAX_PIXELS, MEAN, PACKAGE, SHORT_NAMES, STD, __all__  # noqa: F401
