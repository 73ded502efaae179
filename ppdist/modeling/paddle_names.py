"""How a Paddle suite names a model stage's tensors, declared on the stage class as ``paddle_names``.

ppdist keeps the Paddle suites' attribute names wherever it can, so a stage whose keys are
``<stage>.<the Paddle key>`` (``backbone.conv1.bn.weight``) declares nothing. A stage whose names
differ declares ``paddle_names = PaddleNames(...)``; the weights converter
(``ppdist.convert.weights.naming``) reads it. Plain data: the models do not depend on the converter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

Rename = Tuple[str, str]  # (regular expression on a key inside the stage, replacement)
Constant = Tuple[str, str]  # (key inside the stage, Paddle-style; the stage attribute with its values)


@dataclass(frozen=True)
class PaddleNames:
    """Where a stage's tensors live in a Paddle state dict.

    A ppdist key ``<stage>.<key>`` is looked up as ``<prefix>.<key after renames>``:

    - ``renames``: ``(regular expression, replacement)`` pairs applied in order to the key inside
      the stage;
    - ``prefix``: the stage's name in the Paddle model (default: ppdist's, e.g. ``head``);
    - ``beside_stage``: children of the stage that the Paddle model holds next to the stage rather
      than inside it; their keys get no prefix;
    - ``constants``: frozen Paddle tensors the stage derives instead of storing, as ``(key,
      attribute)``: ``key`` written like a key inside the stage (it gets the renames and the
      prefix) and ``attribute`` the stage's tensor with the same values (any shape with as many
      elements, e.g. a non-persistent buffer). The converter checks the file's values against it.
    """

    renames: Tuple[Rename, ...] = ()
    prefix: Optional[str] = None
    beside_stage: Tuple[str, ...] = ()
    constants: Tuple[Constant, ...] = ()
