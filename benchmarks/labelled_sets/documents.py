"""Document pages whose layout boxes are known because they were drawn: DocLayNet's 11 classes.

No DocLayNet or PubLayNet page with its annotations ships in a package this project can
install, and labelling pages with the model under test would grade it on its own answers.
So each page is typeset here, deterministically from a seed, and every element's box is the
extent of what was drawn for it (text lines' ink boxes, a picture's or a table's rectangle,
a formula's rendered pixels), in DocLayNet's conventions: one box per paragraph, per list
item (bullet included), per caption, per section header; a table's box holds its grid, a
picture's its image, the caption below or above is its own box.

The material is real: prose from the docstrings of Python's standard library, photographs
that ship in scikit-image, formulas rendered by matplotlib's mathtext, DejaVu fonts from
matplotlib.  The pages are cleaner than DocLayNet's scans and PDFs (no noise, one font
family), so a DocLayNet model's mAP here is a check that it finds what is plainly there,
not its DocLayNet score.
"""

from __future__ import annotations

import importlib
import io
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from PIL import Image, ImageDraw, ImageFont

#: DocLayNet's classes in the order Ultralytics' DocLayNet models number them.
CLASSES = (
    "Caption",
    "Footnote",
    "Formula",
    "List-item",
    "Page-footer",
    "Page-header",
    "Picture",
    "Section-header",
    "Table",
    "Text",
    "Title",
)
#: A US Letter page at 93 dpi: DocLayNet's pages are 1025 pixels on their long side.
PAGE_W, PAGE_H = 791, 1024
MARGIN = 64
_PROSE_MODULES = (
    "argparse",
    "asyncio",
    "collections",
    "csv",
    "dataclasses",
    "decimal",
    "email",
    "fractions",
    "functools",
    "heapq",
    "json",
    "logging",
    "pathlib",
    "pickle",
    "random",
    "sched",
    "shlex",
    "statistics",
    "string",
    "textwrap",
    "threading",
    "typing",
    "unittest",
    "urllib",
    "zipfile",
)
_PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "camera", "coins", "moon", "hubble_deep_field")
_FORMULAS = (
    r"$E = m c^{2}$",
    r"$\sum_{i=1}^{n} x_{i}^{2} \leq \left(\sum_{i=1}^{n} |x_{i}|\right)^{2}$",
    r"$\int_{0}^{1} f(x)\,dx \approx \frac{1}{n}\sum_{k=1}^{n} f(x_k)$",
    r"$\hat{y} = \sigma\left(W x + b\right)$",
    r"$p(\theta \mid D) = \frac{p(D \mid \theta)\,p(\theta)}{p(D)}$",
    r"$\mathrm{IoU}(A, B) = \frac{|A \cap B|}{|A \cup B|}$",
    r"$\nabla \cdot \mathbf{E} = \frac{\rho}{\varepsilon_0}$",
)

Box = tuple[int, int, int, int]  # x0, y0, x1, y1


@dataclass
class Page:
    """One page being typeset: the image, and the boxes drawn so far as (class name, box)."""

    image: Image.Image
    draw: ImageDraw.ImageDraw
    boxes: list[tuple[str, Box]] = field(default_factory=list)

    def add(self, name: str, box: Box) -> None:
        assert name in CLASSES
        self.boxes.append((name, box))


def _fonts_dir() -> Path:
    import matplotlib

    return Path(matplotlib.get_data_path()) / "fonts" / "ttf"


def _font(name: str, size: int) -> ImageFont.FreeTypeFont:
    from PIL import ImageFont

    return ImageFont.truetype(str(_fonts_dir() / name), size)


def _sentences() -> list[str]:
    """Sentences of prose from the standard library's module docstrings, deterministic for a Python."""
    out: list[str] = []
    for name in _PROSE_MODULES:
        doc = importlib.import_module(name).__doc__ or ""
        text = re.sub(r"\s+", " ", doc)
        for s in re.split(r"(?<=[.!?])\s+", text):
            words = s.split()
            if 6 <= len(words) <= 40 and re.fullmatch(r"[A-Za-z0-9 ,;:'()\-.!?]+", s):
                out.append(s.strip())
    return out


def _union(boxes: Sequence[Box]) -> Box:
    return (
        min(b[0] for b in boxes),
        min(b[1] for b in boxes),
        max(b[2] for b in boxes),
        max(b[3] for b in boxes),
    )


def _lines(text: str, font: ImageFont.FreeTypeFont, width: int) -> list[str]:
    """``text`` wrapped greedily to lines no wider than ``width`` pixels in ``font``."""
    lines: list[str] = []
    line = ""
    for word in text.split():
        trial = f"{line} {word}".strip()
        if font.getlength(trial) <= width or not line:
            line = trial
        else:
            lines.append(line)
            line = word
    if line:
        lines.append(line)
    return lines


def _text_block(
    page: Page, x: int, y: int, lines: Sequence[str], font: ImageFont.FreeTypeFont, leading: float = 1.3
) -> tuple[Box, int]:
    """Draw ``lines`` from (x, y); the ink box of all of them, and the y below the block."""
    size = int(font.size)
    boxes = []
    for i, line in enumerate(lines):
        ly = y + int(i * size * leading)
        page.draw.text((x, ly), line, font=font, fill=(20, 20, 20))
        b = page.draw.textbbox((x, ly), line, font=font)
        boxes.append((int(b[0]), int(b[1]), int(b[2]), int(b[3])))
    return _union(boxes), y + int(len(lines) * size * leading)


class Typesetter:
    """Pages from a seed: a header and footer, maybe a title, then columns of random blocks."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.sentences = _sentences()
        self.figures = 0
        self.tables = 0

    def prose(self, lo: int, hi: int) -> str:
        return " ".join(self.rng.choice(self.sentences) for _ in range(self.rng.randint(lo, hi)))

    def page(self, number: int, total: int) -> Page:
        from PIL import Image, ImageDraw

        image = Image.new("RGB", (PAGE_W, PAGE_H), (255, 255, 255))
        page = Page(image, ImageDraw.Draw(image))
        rng = self.rng
        small = _font("DejaVuSans.ttf", 11)
        top, bottom = MARGIN, PAGE_H - MARGIN
        if rng.random() < 0.8:
            header = rng.choice(
                ["Technical report", "Proceedings of the workshop", "User manual", "Annual review"]
            )
            x = MARGIN if rng.random() < 0.5 else PAGE_W - MARGIN - int(small.getlength(header))
            box, _ = _text_block(page, x, MARGIN - 30, [header], small)
            page.add("Page-header", box)
        if rng.random() < 0.9:
            label = str(number) if rng.random() < 0.6 else f"Page {number} of {total}"
            x = (PAGE_W - int(small.getlength(label))) // 2
            box, _ = _text_block(page, x, PAGE_H - MARGIN + 16, [label], small)
            page.add("Page-footer", box)
        if rng.random() < 0.35:
            note = _font("DejaVuSerif.ttf", 10)
            text = f"{rng.randint(1, 9)} " + self.prose(1, 2)
            lines = _lines(text, note, PAGE_W - 2 * MARGIN)[:3]
            y = bottom - int(len(lines) * 13) - 4
            box, _ = _text_block(page, MARGIN, y, lines, note)
            page.add("Footnote", box)
            bottom = y - 18
        if rng.random() < 0.35:
            title = _font("DejaVuSerif-Bold.ttf", rng.choice([24, 28, 32]))
            lines = _lines(self.prose(1, 1).rstrip("."), title, PAGE_W - 2 * MARGIN - 80)[:2]
            width = max(int(title.getlength(ln)) for ln in lines)
            box, top = _text_block(page, (PAGE_W - width) // 2, top, lines, title, 1.2)
            page.add("Title", box)
            top += 24
        columns = 2 if rng.random() < 0.45 else 1
        gap = 28
        col_w = (PAGE_W - 2 * MARGIN - (columns - 1) * gap) // columns
        for c in range(columns):
            self.column(page, MARGIN + c * (col_w + gap), top, col_w, bottom)
        return page

    def column(self, page: Page, x: int, y: int, width: int, bottom: int) -> None:
        """Blocks down one column until the next would not fit."""
        kinds = ["Text"] * 5 + ["Section-header"] * 2 + ["List-item"] * 2 + ["Picture", "Table", "Formula"]
        while y < bottom - 40:
            kind = self.rng.choice(kinds)
            end = getattr(self, "_" + kind.lower().replace("-", "_"))(page, x, y, width, bottom)
            if end is None:
                return
            y = end + self.rng.randint(12, 22)

    def _text(self, page: Page, x: int, y: int, width: int, bottom: int) -> int | None:
        font = _font("DejaVuSerif.ttf", self.rng.choice([12, 13, 14]))
        lines = _lines(self.prose(1, 4), font, width)
        room = (bottom - y) // int(font.size * 1.3)
        if room < 2:
            return None
        box, end = _text_block(page, x, y, lines[:room], font)
        page.add("Text", box)
        return end

    def _section_header(self, page: Page, x: int, y: int, width: int, bottom: int) -> int | None:
        font = _font("DejaVuSans-Bold.ttf", self.rng.choice([15, 17, 19]))
        if y + 3 * font.size > bottom:
            return None
        words = self.rng.choice(self.sentences).rstrip(".").split()[: self.rng.randint(2, 5)]
        label = f"{self.rng.randint(1, 9)}.{self.rng.randint(1, 5)} " + " ".join(words).capitalize()
        box, end = _text_block(page, x, y + 6, _lines(label, font, width)[:2], font)
        page.add("Section-header", box)
        return end

    def _list_item(self, page: Page, x: int, y: int, width: int, bottom: int) -> int | None:
        font = _font("DejaVuSerif.ttf", 13)
        step = int(13 * 1.3)
        for _ in range(self.rng.randint(2, 4)):
            lines = _lines(self.prose(1, 1), font, width - 22)[:3]
            if y + len(lines) * step > bottom:
                return None if _ == 0 else y
            bullet, _end = _text_block(page, x + 4, y, ["•"], font)
            box, y = _text_block(page, x + 22, y, lines, font)
            page.add("List-item", _union([bullet, box]))
            y += 5
        return y

    def _caption(self, page: Page, x: int, y: int, width: int, text: str) -> tuple[Box, int]:
        font = _font("DejaVuSans-Oblique.ttf", 11)
        box, end = _text_block(page, x, y, _lines(text, font, width)[:3], font)
        page.add("Caption", box)
        return box, end

    def _picture(self, page: Page, x: int, y: int, width: int, bottom: int) -> int | None:
        import numpy as np
        import skimage.data as data
        from PIL import Image

        w = int(width * self.rng.uniform(0.55, 1.0))
        photo = np.asarray(getattr(data, self.rng.choice(_PHOTOS))())
        h = int(w * photo.shape[0] / photo.shape[1])
        if y + h + 50 > bottom:
            return None
        img = Image.fromarray(photo).convert("RGB").resize((w, h), Image.Resampling.BILINEAR)
        px = x + (width - w) // 2
        page.image.paste(img, (px, y))
        page.add("Picture", (px, y, px + w, y + h))
        self.figures += 1
        _, end = self._caption(page, x, y + h + 8, width, f"Figure {self.figures}: " + self.prose(1, 1))
        return end

    def _table(self, page: Page, x: int, y: int, width: int, bottom: int) -> int | None:
        rows, cols = self.rng.randint(3, 7), self.rng.randint(3, 5)
        font = _font("DejaVuSans.ttf", 11)
        row_h = 20
        self.tables += 1
        cap_box, top = self._caption_if_room(page, x, y, width, bottom, rows * row_h + 40)
        if cap_box is None:
            self.tables -= 1
            return None
        w = int(width * self.rng.uniform(0.7, 1.0))
        left = x + (width - w) // 2
        cell = w // cols
        header = [self.rng.choice(self.sentences).split()[0].capitalize() for _ in range(cols)]
        for r in range(rows):
            for c in range(cols):
                text = header[c] if r == 0 else f"{self.rng.uniform(0, 1000):.{self.rng.randint(0, 2)}f}"
                page.draw.text((left + c * cell + 6, top + r * row_h + 4), text, font=font, fill=(20, 20, 20))
        bottom_y = top + rows * row_h
        for r in (0, 1, rows):  # booktabs rules: top, below the header, bottom
            page.draw.line(
                [(left, top + r * row_h), (left + cols * cell, top + r * row_h)], fill=(0, 0, 0), width=1
            )
        page.add("Table", (left, top, left + cols * cell, bottom_y + 1))
        return bottom_y

    def _caption_if_room(
        self, page: Page, x: int, y: int, width: int, bottom: int, body: int
    ) -> tuple[Box | None, int]:
        if y + body > bottom:
            return None, y
        box, end = self._caption(page, x, y, width, f"Table {self.tables}: " + self.prose(1, 1))
        return box, end + 8

    def _formula(self, page: Page, x: int, y: int, width: int, bottom: int) -> int | None:
        import numpy as np
        from matplotlib import mathtext
        from PIL import Image

        buf = io.BytesIO()
        mathtext.math_to_image(
            self.rng.choice(_FORMULAS), buf, dpi=self.rng.choice([90, 110, 130]), format="png"
        )
        img = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
        if img.width > width:
            img = img.resize((width, int(img.height * width / img.width)), Image.Resampling.BILINEAR)
        if y + img.height + 10 > bottom:
            return None
        px = x + (width - img.width) // 2
        page.image.paste(img, (px, y + 4))
        ink = np.argwhere(np.asarray(img.convert("L")) < 200)
        (y0, x0), (y1, x1) = ink.min(axis=0), ink.max(axis=0)
        page.add("Formula", (px + int(x0), y + 4 + int(y0), px + int(x1) + 1, y + 4 + int(y1) + 1))
        return y + 4 + img.height


def make(out: Path, pages: int = 40, seed: int = 0) -> dict[str, Any]:
    """Write ``pages`` pages to ``out/images`` and their COCO annotations to ``out/annotations.json``."""
    import json

    images_dir = out / "images"
    images_dir.mkdir(parents=True, exist_ok=True)
    setter = Typesetter(seed)
    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for n in range(1, pages + 1):
        page = setter.page(n, pages)
        name = f"page-{n:03d}.png"
        page.image.save(images_dir / name)
        images.append({"id": n, "file_name": name, "width": PAGE_W, "height": PAGE_H})
        for cls, (x0, y0, x1, y1) in page.boxes:
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": n,
                    "category_id": CLASSES.index(cls) + 1,
                    "bbox": [x0, y0, x1 - x0, y1 - y0],
                    "area": (x1 - x0) * (y1 - y0),
                    "iscrowd": 0,
                }
            )
    coco = {
        "info": {"description": f"typeset document pages, seed {seed}: boxes by construction"},
        "images": images,
        "annotations": annotations,
        "categories": [{"id": i + 1, "name": c} for i, c in enumerate(CLASSES)],
    }
    (out / "annotations.json").write_text(json.dumps(coco))
    return coco
