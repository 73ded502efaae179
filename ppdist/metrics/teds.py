"""TEDS, tree-edit-distance similarity of two HTML tables (ppstructure's ``TEDS``: Zhong et al.,
"Image-based table recognition"), on lxml's HTML parser and the ``apted`` tree edit distance.

``1 - distance / max(node count)``: nodes are the table's elements; renaming costs 1 when the
tags or a cell's colspan / rowspan differ, else (full TEDS) the normalised Levenshtein distance of
the two cells' content tokens, 0 in structure-only TEDS. An empty HTML on either side, or one
without ``<body><table>``, scores 0; two empty tables score 1.
"""

from __future__ import annotations

from typing import Iterable, List, Optional, Sequence

from apted import APTED, Config
from lxml import etree, html
from rapidfuzz.distance import Levenshtein

HTML_HEAD, HTML_TAIL = "<html><body><table>", "</table></body></html>"


def structure_html(tokens: Iterable[str]) -> str:
    """The HTML of a structure token list, wrapped as ppstructure wraps it."""
    return HTML_HEAD + "".join(tokens) + HTML_TAIL


class TableNode:
    """One element of the table tree: its tag, and for cells the spans and content tokens."""

    def __init__(
        self,
        tag: str,
        colspan: Optional[int] = None,
        rowspan: Optional[int] = None,
        content: Optional[List[str]] = None,
    ) -> None:
        self.tag = tag
        self.colspan = colspan
        self.rowspan = rowspan
        self.content = content
        self.children: List["TableNode"] = []


class _CellCost(Config):
    """apted's costs: delete / insert 1; rename as the module docstring says."""

    def rename(self, node1: TableNode, node2: TableNode) -> float:
        if (node1.tag, node1.colspan, node1.rowspan) != (node2.tag, node2.colspan, node2.rowspan):
            return 1.0
        if node1.tag == "td" and (node1.content or node2.content):
            return Levenshtein.normalized_distance(node1.content, node2.content)
        return 0.0

    def children(self, node: TableNode) -> List[TableNode]:
        return node.children


def _cell_tokens(node: etree._Element) -> List[str]:
    """A cell's content tokens: inner tags as ``<tag>`` / ``</tag>``, text character by character."""
    tokens: List[str] = []

    def walk(element: etree._Element, outer: bool) -> None:
        if not outer:
            tokens.append(f"<{element.tag}>")
        tokens.extend(element.text or "")
        for child in element:
            walk(child, False)
        if not outer:
            if element.tag != "unk":
                tokens.append(f"</{element.tag}>")
            if element.tag != "td":
                tokens.extend(element.tail or "")

    walk(node, True)
    return tokens


class TEDS:
    """``evaluate(pred_html, true_html) -> float``; ``structure_only`` ignores cell content;
    ``ignore_nodes`` tags are stripped (their children kept) before comparing."""

    def __init__(self, structure_only: bool = False, ignore_nodes: Optional[Sequence[str]] = None) -> None:
        self.structure_only = structure_only
        self.ignore_nodes = list(ignore_nodes or ())

    def tree(self, element: etree._Element) -> TableNode:
        """The apted tree of an lxml element (cells are leaves)."""
        if element.tag == "td":
            content = [] if self.structure_only else _cell_tokens(element)
            return TableNode(
                "td",
                int(element.attrib.get("colspan", "1")),
                int(element.attrib.get("rowspan", "1")),
                content,
            )
        node = TableNode(element.tag)
        node.children = [self.tree(child) for child in element]
        return node

    def evaluate(self, pred: str, true: str) -> float:
        if not pred or not true:
            return 0.0
        parser = html.HTMLParser(remove_comments=True, encoding="utf-8")
        pred_root, true_root = html.fromstring(pred, parser=parser), html.fromstring(true, parser=parser)
        pred_tables, true_tables = pred_root.xpath("body/table"), true_root.xpath("body/table")
        if not pred_tables or not true_tables:
            return 0.0
        pred_table, true_table = pred_tables[0], true_tables[0]
        if self.ignore_nodes:
            etree.strip_tags(pred_table, *self.ignore_nodes)
            etree.strip_tags(true_table, *self.ignore_nodes)
        n_nodes = max(len(pred_table.xpath(".//*")), len(true_table.xpath(".//*")))
        if n_nodes == 0:  # two empty tables are equal (ppstructure divides by zero here)
            return 1.0
        distance = APTED(self.tree(pred_table), self.tree(true_table), _CellCost()).compute_edit_distance()
        return 1.0 - float(distance) / n_nodes
