"""Polygon matching of PaddleOCR's ``DetMetric`` (DetectionIoUEvaluator: IoU > 0.5, one-to-one,
greedy in ground-truth then prediction order), for the table metric's cell boxes.

Polygons are exact-area quadrilaterals (or any simple polygons): the intersection is the sum over
a triangle fan of each with Sutherland-Hodgman clipping, so no geometry library is needed. A
polygon with zero area or crossing edges is invalid and left out, as shapely's ``is_valid`` does.
"""

from __future__ import annotations

from typing import List, NamedTuple, Sequence, Tuple

Point = Tuple[float, float]
IOU_THRESHOLD = 0.5


class MatchCounts(NamedTuple):
    """One image's care counts: ground truths, predictions and matched pairs."""

    gt: int
    det: int
    matched: int


def signed_area(poly: Sequence[Point]) -> float:
    """Shoelace area, positive counter-clockwise (y up)."""
    n = len(poly)
    return 0.5 * sum(poly[i][0] * poly[(i + 1) % n][1] - poly[(i + 1) % n][0] * poly[i][1] for i in range(n))


def _cross(o: Point, a: Point, b: Point) -> float:
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def _segments_cross(p1: Point, p2: Point, q1: Point, q2: Point) -> bool:
    d1, d2 = _cross(q1, q2, p1), _cross(q1, q2, p2)
    d3, d4 = _cross(p1, p2, q1), _cross(p1, p2, q2)
    return d1 * d2 < 0 and d3 * d4 < 0


def is_valid(poly: Sequence[Point]) -> bool:
    """A simple polygon of at least 3 points with non-zero area (no two non-adjacent edges cross)."""
    n = len(poly)
    if n < 3 or signed_area(poly) == 0:
        return False
    for i in range(n):
        for j in range(i + 2, n):
            if (j + 1) % n == i:
                continue
            if _segments_cross(poly[i], poly[(i + 1) % n], poly[j], poly[(j + 1) % n]):
                return False
    return True


def triangles(poly: Sequence[Point]) -> List[List[Point]]:
    """Counter-clockwise triangles covering a simple polygon exactly (ear clipping)."""
    pts = list(poly) if signed_area(poly) > 0 else list(reversed(poly))
    out = []
    while len(pts) > 3:
        for i in range(len(pts)):
            a, b, c = pts[i - 1], pts[i], pts[(i + 1) % len(pts)]
            if _cross(a, b, c) <= 0:
                continue
            if any(_inside_triangle(p, a, b, c) for p in pts if p not in (a, b, c)):
                continue
            out.append([a, b, c])
            del pts[i]
            break
        else:  # numerically degenerate: keep the rest as one fan
            break
    out.append(pts)
    return out


def _inside_triangle(p: Point, a: Point, b: Point, c: Point) -> bool:
    return _cross(a, b, p) >= 0 and _cross(b, c, p) >= 0 and _cross(c, a, p) >= 0


def _clip(subject: List[Point], clip: Sequence[Point]) -> List[Point]:
    """Sutherland-Hodgman: ``subject`` clipped by the convex counter-clockwise ``clip``."""
    out = subject
    for i in range(len(clip)):
        a, b = clip[i], clip[(i + 1) % len(clip)]
        points, out = out, []
        for j in range(len(points)):
            p, q = points[j], points[(j + 1) % len(points)]
            p_in, q_in = _cross(a, b, p) >= 0, _cross(a, b, q) >= 0
            if p_in:
                out.append(p)
            if p_in != q_in:
                dp, dq = _cross(a, b, p), _cross(a, b, q)
                t = dp / (dp - dq)
                out.append((p[0] + t * (q[0] - p[0]), p[1] + t * (q[1] - p[1])))
        if not out:
            return []
    return out


def intersection_area(p: Sequence[Point], q: Sequence[Point]) -> float:
    """The area common to two simple polygons."""
    total = 0.0
    for tp in triangles(p):
        for tq in triangles(q):
            clipped = _clip(list(tp), tq)
            if len(clipped) >= 3:
                total += abs(signed_area(clipped))
    return total


def iou(p: Sequence[Point], q: Sequence[Point]) -> float:
    inter = intersection_area(p, q)
    return inter / (abs(signed_area(p)) + abs(signed_area(q)) - inter)


def match_counts(gts: Sequence[Sequence[Point]], dets: Sequence[Sequence[Point]]) -> MatchCounts:
    """DetectionIoUEvaluator.evaluate_image without ignored ground truths: invalid polygons are
    left out; gt i and det j match when both are unmatched and IoU > 0.5, scanning gt then det."""
    gt_polys = [g for g in gts if is_valid(g)]
    det_polys = [d for d in dets if is_valid(d)]
    gt_used, det_used = [False] * len(gt_polys), [False] * len(det_polys)
    ious = [[iou(d, g) for d in det_polys] for g in gt_polys]
    matched = 0
    for i in range(len(gt_polys)):
        for j in range(len(det_polys)):
            if not gt_used[i] and not det_used[j] and ious[i][j] > IOU_THRESHOLD:
                gt_used[i] = det_used[j] = True
                matched += 1
    return MatchCounts(len(gt_polys), len(det_polys), matched)
