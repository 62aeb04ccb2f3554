"""Why a step takes what it takes, and what would change it: critical path, what-if, diffs, the HTML report.

Everything here reads the costed graph and the report that :func:`echosim.compiler.lower`
returns; nothing composes time. What-if suggestions are neighbouring layouts compiled for real.

* :func:`explain` (``echosim explain``): critical path, communication per axis, bubble,
  overlap slowdown and the suggestions;
* :func:`suggest`, :func:`cheapest_fit`, :func:`neighbours`: the what-if neighbourhood;
* :func:`critical_path`: the longest path through the costed graph, attributed to ops;
* :func:`compare` (``echosim diff``): two reports term by term;
* :mod:`echosim.explain.html` (``compile --report``) and :mod:`echosim.explain.charts`.
"""

from echosim.explain.critical import CriticalPath, Share, critical_path
from echosim.explain.diff import Comparison, Term, compare, load_report
from echosim.explain.step import Explanation, explain
from echosim.explain.whatif import Outcome, cheapest_fit, neighbours, suggest

__all__ = [
    "Comparison",
    "CriticalPath",
    "Explanation",
    "Outcome",
    "Share",
    "Term",
    "cheapest_fit",
    "compare",
    "critical_path",
    "explain",
    "load_report",
    "neighbours",
    "suggest",
]
