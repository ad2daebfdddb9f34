"""Per-layer kernels for OpenVINO's CPU plugin, where the plugin's own choice was measured slower.

The CPU plugin picks one oneDNN implementation per layer from a fixed order.  On a CPU with
AMX it takes the AMX kernels (``brgconv_avx512_amx``) for every int8 convolution they can run,
and its brgemm depthwise kernel for the depthwise ones.  Measured on EfficientNet-Lite0's
full-range int8 IR, 2 threads, a Sapphire Rapids class CPU (``python -m
benchmarks.openvino_kernels``; per-layer times from the plugin's own profiling):

- the stem, 3 input channels: 111-139 us on AMX, 83-95 us on the AVX-512 VNNI kernel
  (``jit_avx512``).  An AMX int8 tile row holds 64 bytes of the reduction; three channels
  per tap leave most of it padding.
- the 16 depthwise layers on the jit kernel instead: most ran 0-8 us slower, but the AMX 1x1
  convolutions around them 1-10 us faster, about 50 us in all.  Measured, not explained.

Together the model ran 3-9% faster (p50 back to back; five runs of the benchmark, each
interleaving both ways: 1.03-1.09x, most near 1.08x), its outputs bit-identical: the same
integer arithmetic.  On the portable int8 IR, whose first six layers stay fp32, only the
depthwise rule applies, and it changed nothing there (0.99-1.01x).  On a CPU with VNNI but no
AMX the plugin already runs the stem on the VNNI kernel, and the jit depthwise kernel was no
faster (oneDNN limited to ``AVX512_CORE_VNNI``), so the rules ask for AMX.

A rule (``openvino_kernels.json``) names the CPU flags it needs, the layers it applies to (int8
convolutions: input 0 produced by a FakeQuantize) and the implementation to prefer.  The plugin
reads a layer's preference from the ``primitives_priority`` runtime attribute of the IR, so
the preference is written into the IR's text in memory before it is read; the file is never
changed.  An implementation the CPU cannot run is passed over by the plugin, which then keeps
its own order: a preference never stops a model from loading.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

RULES_FILE = Path(__file__).with_name("openvino_kernels.json")
ATTRIBUTE = "primitives_priority"  # ov::PrimitivesPriority's name in the IR's rt_info
_CONVOLUTIONS = ("Convolution", "GroupConvolution")


@dataclass(frozen=True)
class Layer:
    """An int8 convolution of an IR, as the rules see it."""

    name: str
    op: str
    input_channels: int
    depthwise: bool


@dataclass(frozen=True)
class Rule:
    """Prefer ``kernel`` for the int8 ``op`` layers it matches, on a CPU with all of ``cpu_flags``."""

    name: str
    cpu_flags: frozenset[str]
    op: str
    kernel: str
    why: str
    max_input_channels: int | None = None
    depthwise: bool | None = None

    def applies(self, layer: Layer, flags: frozenset[str]) -> bool:
        return (
            self.cpu_flags <= flags
            and layer.op == self.op
            and (self.max_input_channels is None or layer.input_channels <= self.max_input_channels)
            and (self.depthwise is None or layer.depthwise == self.depthwise)
        )


@dataclass(frozen=True)
class Choice:
    """One layer's preferred implementation, and the rule that asked for it."""

    layer: str
    kernel: str
    rule: str

    def __str__(self) -> str:
        return f"{self.layer}: {self.kernel} ({self.rule})"


@cache
def rules() -> tuple[Rule, ...]:
    """The rules of ``openvino_kernels.json``, in order: a layer takes the first that applies."""
    data = json.loads(RULES_FILE.read_text(encoding="utf-8"))
    return tuple(
        Rule(
            name=r["name"],
            cpu_flags=frozenset(r["cpu_flags"]),
            op=r["op"],
            kernel=r["kernel"],
            why=r["why"],
            max_input_channels=r.get("max_input_channels"),
            depthwise=r.get("depthwise"),
        )
        for r in data["rules"]
    )


def choose(root: ET.Element, flags: Iterable[str]) -> list[Choice]:
    """The preferred implementation of each int8 convolution of the IR ``root`` that a rule applies to."""
    return [choice for _, choice in _chosen(root, frozenset(flags))]


def prefer(xml: Path, flags: Iterable[str]) -> tuple[bytes, list[Choice]] | None:
    """The IR's text with the chosen preferences written in, and the choices; None when none apply.

    None too when the file does not parse: OpenVINO's reader then reports it as it would.
    """
    have = frozenset(flags)
    if not any(r.cpu_flags <= have for r in rules()):
        return None  # no rule is for this CPU: not worth parsing the IR
    try:
        root = ET.parse(xml).getroot()
    except (ET.ParseError, OSError):
        return None
    choices = []
    for element, choice in _chosen(root, have):
        info = element.find("rt_info")
        if info is None:
            info = ET.SubElement(element, "rt_info")
        for old in info.findall(f"attribute[@name='{ATTRIBUTE}']"):
            info.remove(old)
        ET.SubElement(info, "attribute", {"name": ATTRIBUTE, "version": "0", "value": choice.kernel})
        choices.append(choice)
    return (ET.tostring(root), choices) if choices else None


def _chosen(root: ET.Element, flags: frozenset[str]) -> Iterator[tuple[ET.Element, Choice]]:
    for element, layer in _int8_convolutions(root):
        rule = next((r for r in rules() if r.applies(layer, flags)), None)
        if rule is not None:
            yield element, Choice(layer.name, rule.kernel, rule.name)


def _int8_convolutions(root: ET.Element) -> Iterator[tuple[ET.Element, Layer]]:
    """Each convolution whose data input comes from a FakeQuantize (what the plugin runs in int8).

    Only the graph's own layers and edges: a loop's body (TensorIterator, Loop) numbers its own.
    """
    layers = {element.get("id"): element for element in root.findall("layers/layer")}
    source = {(e.get("to-layer"), e.get("to-port")): e.get("from-layer") for e in root.findall("edges/edge")}
    for element in layers.values():
        op = element.get("type", "")
        ports = element.findall("input/port")
        if op not in _CONVOLUTIONS or len(ports) < 2:
            continue
        feed = layers.get(source.get((element.get("id"), ports[0].get("id"))))
        if feed is None or feed.get("type") != "FakeQuantize":
            continue
        try:
            weights = [int(d.text or "") for d in ports[1].findall("dim")]
        except ValueError:
            continue
        # Convolution weights: [out, in, kh, kw]; GroupConvolution: [groups, out/g, in/g, kh, kw].
        if op == "Convolution" and len(weights) >= 3:
            yield element, Layer(element.get("name", ""), op, weights[1], depthwise=False)
        elif op == "GroupConvolution" and len(weights) >= 4:
            depthwise = weights[1] == 1 and weights[2] == 1
            yield element, Layer(element.get("name", ""), op, weights[0] * weights[2], depthwise)
