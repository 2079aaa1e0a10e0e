"""A sentence under a plot saying what to look for, written into the PNG itself: a plot
is opened alone as often as in its page, and a figure without words leaves the reader to
guess which line matters."""

from __future__ import annotations

import textwrap

from matplotlib.figure import Figure

FONT_PT = 8
CHARS_PER_INCH = 15  # of 8-point text: where a caption's lines wrap
LINE_INCHES = 0.16


def captioned(fig: Figure, text: str) -> None:
    """Lay `fig` out tightly above `text`, wrapped to its width, in small grey type."""
    width_in, height_in = fig.get_size_inches()
    lines = textwrap.wrap(text, int(width_in * CHARS_PER_INCH)) if text else []
    bottom = (len(lines) * LINE_INCHES + 0.1) / height_in if lines else 0.0
    fig.tight_layout(rect=(0, bottom, 1, 1))
    if lines:
        fig.text(0.01, 0.02 / height_in, "\n".join(lines), fontsize=FONT_PT, color="#444444")
