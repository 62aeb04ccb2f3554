"""Why a step takes what it takes, and what would change it: critical path, what-if, diffs, the HTML report.

Everything here reads the costed graph and the report that :func:`echosim.compiler.lower`
returns; nothing composes time. What-if suggestions are neighbouring layouts compiled for real.
"""
