"""What a chapter's table method returns (issue 46): one :class:`Table`, shown by its notebook cell as::

    t = ch.table2()
    t.show()            # the frame, its figure, its note (without a frame: the note saying why)
    ch.glue(t.values)   # the numbers the page's prose quotes

so a cell has no ``if frame is not None`` of its own: a method that has nothing to tabulate returns
``Table(None, values, note=...)`` and ``show`` prints the note in the frame's place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PARTS = ("frame", "figure", "note")  # what ``show`` shows, in this order unless a table names another


@dataclass
class Table:
    """A chapter's table, its glue values, a note and a figure, as one value.

    - ``frame``: a DataFrame or a pandas Styler (shown with ``display``), or None when there is nothing to tabulate;
    - ``values``: the numbers and texts the page's prose quotes (``Chapter.glue``); never shown by ``show``;
    - ``note``: a line beside the frame (where its data came from), or in its place when the frame is None (what
      is missing, and the command that makes it); a str is printed, anything else (a ``Markdown``) displayed;
      None: no line;
    - ``figure``: the figure (or list of figures) the method drew, or None; ``show`` shows it with
      ``plt.show()``, as the cells did;
    - ``data``: what later cells of the page take from this table (the rows its headlines quote); never shown;
    - ``order``: the order ``show`` shows the parts in (a subset of :data:`PARTS`; absent parts are not shown);
    - ``print_note``: False: a str note is displayed as a value (``display(str)``: its repr), as the readings'
      "no stored run yet" lines always were.
    """

    frame: Any = None
    values: dict[str, Any] = field(default_factory=dict)
    note: Any = None
    figure: Any = None
    data: Any = None
    order: tuple[str, ...] = PARTS
    print_note: bool = True

    def __post_init__(self) -> None:
        unknown = [part for part in self.order if part not in PARTS]
        if unknown or len(set(self.order)) != len(self.order):
            raise ValueError(f"Table.order: each of {', '.join(PARTS)} at most once (got {self.order!r})")

    @classmethod
    def formatted(cls, frame, values: dict[str, Any] | None = None, missing: str | None = None,
                  **style: Any) -> Table:
        """A table that may have no rows yet (the readings and screens of stored runs): ``frame`` as
        ``frame.style.format(**style)``, or, when it is None, ``missing`` shown in its place as a value
        (``print_note=False``)."""
        values = {} if values is None else values
        if frame is None:
            return cls(None, values, note=missing, print_note=False)
        return cls(frame.style.format(**style), values)

    def show(self) -> None:
        """Display the table in a notebook: each part of ``order`` that is not None."""
        # lazy: IPython (book extra); the queue imports the chapters without it
        from IPython.display import display

        for part in self.order:
            if part == "frame" and self.frame is not None:
                display(self.frame)
            elif part == "note" and self.note is not None:
                if isinstance(self.note, str) and self.print_note:
                    print(self.note)
                else:
                    display(self.note)
            elif part == "figure" and self.figure is not None:
                # lazy: matplotlib (~0.5 s) stays out of the queue, which imports the chapters
                import matplotlib.pyplot as plt

                plt.show()
