"""Gradient tensors of the models the simulation all-reduces, as element counts
(fp32 on the wire), from the reference architectures' shapes, counted here so the
simulation needs no framework:

* AlexNet — torchvision's (61,100,840 parameters, 16 tensors; fc6 alone is 62 %).
* ResNet-50 — torchvision's v1.5 (25,557,032 parameters, 161 tensors with BN).
* BERT-base — the uncased encoder with its pooler (109,482,240 parameters)."""
from __future__ import annotations

from typing import Dict, List

BYTES_PER_ELEMENT = 4  # fp32 gradients


def alexnet() -> List[int]:
    convs = [(64, 3, 11), (192, 64, 5), (384, 192, 3), (256, 384, 3), (256, 256, 3)]
    out: List[int] = []
    for cout, cin, k in convs:
        out += [cout * cin * k * k, cout]
    for fout, fin in [(4096, 256 * 6 * 6), (4096, 4096), (1000, 4096)]:
        out += [fout * fin, fout]
    return out


def resnet50() -> List[int]:
    out = [64 * 3 * 7 * 7, 64, 64]  # conv1, bn1 weight and bias
    inplanes = 64
    for planes, blocks in [(64, 3), (128, 4), (256, 6), (512, 3)]:
        for b in range(blocks):
            out += [planes * inplanes, planes, planes,
                    planes * planes * 9, planes, planes,
                    planes * 4 * planes, planes * 4, planes * 4]
            if b == 0:  # downsample projection and its BN
                out += [planes * 4 * inplanes, planes * 4, planes * 4]
            inplanes = planes * 4
    return out + [1000 * 2048, 1000]


def bert_base(vocab: int = 30522, hidden: int = 768, layers: int = 12,
              ffn: int = 3072, positions: int = 512) -> List[int]:
    out = [vocab * hidden, positions * hidden, 2 * hidden, hidden, hidden]
    for _ in range(layers):
        for _ in range(4):  # query, key, value, attention output
            out += [hidden * hidden, hidden]
        out += [hidden, hidden, ffn * hidden, ffn, hidden * ffn, hidden, hidden, hidden]
    return out + [hidden * hidden, hidden]  # pooler


MODELS = {"alexnet": alexnet, "resnet50": resnet50, "bert-base": bert_base}


def gradient_bytes(name: str) -> List[int]:
    return [n * BYTES_PER_ELEMENT for n in MODELS[name]()]


def summary() -> Dict[str, int]:
    return {name: sum(fn()) for name, fn in MODELS.items()}
