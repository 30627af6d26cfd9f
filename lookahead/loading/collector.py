"""The cyclic garbage collector paused while a model loads.

Loading a model makes hundreds of thousands of Python objects that live on (the tokenizer's vocabulary, the
GGUF reader's fields, transformers' tensor-name maps, the modules), and CPython's full collection runs each
time the objects that survived the younger ones reach a quarter of those it walked before, walking every
object each time: a load spends a good part of its time walking the same objects again. ``collections_paused``
turns the collector off for the load and back on after it, as it was; what the load left in reference cycles
is collected by the collections that follow. Reference counting frees everything else as usual meanwhile.

Worked example: ``with collections_paused(): ...`` with the collector on -> off inside, on after (also when the
body raises); with it off already -> off inside and after.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collections_paused() -> Iterator[None]:
    """The cyclic garbage collector off inside, then as it was (see the module's docstring)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
